"""What the Ray workers of a local cluster print, printed by the driver: ``(HybridWorker pid=1234) line``.

Ray starts a log monitor on every node, a Python process (~90 MB resident) that tails the workers' log files and
sends their lines through GCS to the driver. A cluster that ``easyr1.main.init_ray`` starts is one node whose only
client is this process, so the driver reads those files itself instead (:func:`easyr1.main.closed_local_cluster`
starts the node without Ray's log monitor). A cluster started with ``ray start`` keeps Ray's own log monitors.

The files are Ray's: ``<logs dir>/worker-<worker id>-<job id>-<pid>.out`` and ``.err`` (a worker's stdout and
stderr), whose first lines name the job and the actor (``:job_id:01000000``, ``:actor_name:HybridWorker``), and
``raylet.err``. Stdout lines go to this process's stdout, stderr lines to its stderr, whole lines only until
:meth:`WorkerLogForwarder.stop`, which prints what is left (a dying worker's last words).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path


WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-[0-9a-f]+-(\d+)\.(out|err)$")
RAYLET_LOG = "raylet.err"
# Ray's marker lines at the top of a worker's log files (ray_constants.LOG_PREFIX_*): who writes the lines below
ACTOR_NAME, TASK_NAME, JOB_ID = ":actor_name:", ":task_name:", ":job_id:"


@dataclass
class _LogFile:
    """How far one file has been printed, and whose lines it holds."""

    prefix: str  # "(HybridWorker pid=1234) ", "(raylet) "
    to_stderr: bool
    offset: int = 0
    pid: int = 0


class WorkerLogForwarder:
    """Prints the new lines of a node's worker (and raylet error) log files every ``interval`` seconds, from a
    daemon thread, until :meth:`stop`."""

    def __init__(self, logs_dir: str | Path, interval: float = 0.2) -> None:
        self.logs_dir = Path(logs_dir)
        self.interval = interval
        self.files: dict[str, _LogFile] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="easyr1-worker-logs", daemon=True)

    def start(self) -> WorkerLogForwarder:
        """Poll from now on, in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling, then print every file's remaining text, a last line without its newline included."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll(final=True)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            self.poll()

    def poll(self, final: bool = False) -> None:
        """Print what each file gained since the last poll: its complete lines (``final``: everything)."""
        with self._lock:
            try:
                with os.scandir(self.logs_dir) as entries:
                    sizes = {entry.name: entry.stat().st_size for entry in entries}
            except OSError:  # the session directory is gone (the cluster was shut down and cleaned up)
                return
            for name in sorted(sizes):
                log = self.files.get(name) or self._track(name)
                if log is not None and sizes[name] != log.offset:  # a file unchanged since the last poll: not opened
                    self._forward(self.logs_dir / name, log, final)

    def _track(self, name: str) -> _LogFile | None:
        match = WORKER_LOG.match(name)
        if match:
            log = _LogFile(prefix=f"(pid={match[1]}) ", to_stderr=match[2] == "err", pid=int(match[1]))
        elif name == RAYLET_LOG:
            log = _LogFile(prefix="(raylet) ", to_stderr=True)
        else:
            return None
        self.files[name] = log
        return log

    def _forward(self, path: Path, log: _LogFile, final: bool) -> None:
        try:
            with path.open("rb") as file:
                file.seek(0, 2)
                if file.tell() < log.offset:  # rotated by Ray: the file starts again
                    log.offset = 0
                file.seek(log.offset)
                text = file.read()
        except OSError:
            return
        end = len(text) if final else text.rfind(b"\n") + 1
        if end <= 0:
            return
        log.offset += end
        lines = text[:end].decode("utf-8", errors="replace").splitlines()
        shown = []
        for line in lines:
            for marker in (ACTOR_NAME, TASK_NAME):
                if line.startswith(marker) and log.pid:
                    log.prefix = f"({line[len(marker) :]} pid={log.pid}) "
                    break
            else:
                if not line.startswith((ACTOR_NAME, TASK_NAME, JOB_ID)):
                    shown.append(log.prefix + line + "\n")
        if shown:
            stream = sys.stderr if log.to_stderr else sys.stdout
            stream.write("".join(shown))
            stream.flush()
