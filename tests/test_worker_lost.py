"""A worker killed with ``kill -9`` mid-run: the run stops within a minute with one easyr1 message (which rank on
which node died, in which call of which step, the last intact checkpoint and the command that continues from it), no
Ray traceback, and no process of the run left behind."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO
from test_cli import base_args

from easyr1.checkpoint.manager import CheckpointDirectory


pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.e2e]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_worker_killed_mid_run_stops_the_run_with_the_command_that_resumes_it(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path
):
    run_dir = tmp_path / "run"
    args = [
        *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
        "trainer.max_steps=200",
        "trainer.save_freq=1",
        "trainer.save_limit=2",
        f"trainer.save_checkpoint_path={run_dir}",
    ]
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-m", "easyr1.main", *args],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            wait_for(lambda: (run_dir / "global_step_2").is_dir() or driver.poll() is not None, 300, "step 2")
            assert driver.poll() is None, stderr.read_text()[-3000:]
            family = psutil.Process(driver.pid).children(recursive=True)
            workers = [p for p in family if any("HybridWorker" in part for part in p.cmdline())]
            assert len(workers) == 2, [p.cmdline() for p in family]
            workers[1].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            code = driver.wait(timeout=90)
            stopped_after = time.monotonic() - killed
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    console = stdout.read_text() + stderr.read_text()
    assert code == 1, console[-3000:]
    assert stopped_after < 60, stopped_after
    assert "Traceback" not in console, console[-3000:]
    assert "ActorDiedError" not in console.replace("(ActorDiedError)", "")  # Ray's own report of it, not ours
    error = re.search(
        r"easyr1: error: worker rank (\d) on node (\S+) died during HybridWorker\.(\w+) of step (\d+)", console
    )
    assert error, console[-3000:]
    last = CheckpointDirectory(run_dir).complete_steps()[-1]
    assert int(error.group(4)) > last >= 2  # the step that was running, after the last one saved
    step_dir = run_dir / f"global_step_{last}"
    assert f"easyr1: the last intact checkpoint is {step_dir} (step {last}); continue from it with:" in console
    command = next(line.strip() for line in console.splitlines() if "-m easyr1.main" in line)
    assert shlex.split(command)[3:] == [*args, f"trainer.load_checkpoint_path={step_dir}"]
    # the checkpoint is complete: what a resume reads is all there, and a resume would pick it
    assert {path.name for path in step_dir.iterdir()} >= {"actor", "trainer_state.pt", "config.yaml"}
    assert CheckpointDirectory(run_dir).resume_path(None, find_last_checkpoint=True) == step_dir
    # nothing of the run is left: its Ray processes, the other worker, the reward function's child process
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), 20, "cleanup")


@pytest.mark.ray
def test_a_rank_failing_because_its_peer_died_reports_the_dead_peer():
    """The surviving rank's collective fails ("Connection reset by peer") before Ray reports the killed rank: the
    run's message names the rank that died, not the survivor's traceback."""
    import ray
    from helpers import start_ray

    from easyr1.distributed.worker_group import WorkerGroup
    from easyr1.errors import WorkerLost

    @ray.remote(num_cpus=0)
    class Rank:
        def fail_at_once(self) -> None:
            raise RuntimeError("Connection reset by peer")

        def die_soon(self) -> None:
            time.sleep(1.0)
            os._exit(1)

        def finish(self) -> int:
            return 0

    start_ray()
    survivor, dying = Rank.remote(), Rank.remote()
    group = object.__new__(WorkerGroup)  # only _gather's surface: the ranks' addresses and the worker class
    group.addresses, group.worker_cls = ["10.0.0.1", "10.0.0.2"], type("HybridWorker", (), {})
    with pytest.raises(WorkerLost) as lost:
        group._gather([survivor.fail_at_once.remote(), dying.die_soon.remote()], "generate")
    assert (lost.value.rank, lost.value.node) == (1, "10.0.0.2")
    # no rank died: the failure is the survivor's own, as it was
    with pytest.raises(ray.exceptions.RayTaskError, match="Connection reset"):
        group._gather([survivor.fail_at_once.remote(), survivor.finish.remote()], "generate")
