"""The driver prints its local cluster's worker output (``distributed/worker_logs.py``), read from log files written as
Ray's workers write them: a worker's stdout lines on stdout and its stderr lines on stderr, each prefixed with the
actor's name and the worker's pid, Ray's marker lines left out, a line only once it is whole, the rest at stop."""

from __future__ import annotations

from pathlib import Path

from easyr1.distributed.worker_logs import WorkerLogForwarder


WORKER = "worker-a3d1368e486c39e30841548d4a4c55d2eb25ca462e92f53639a738eb-01000000-7862"


def append(path: Path, text: str) -> None:
    with path.open("a") as file:
        file.write(text)


def test_worker_lines_reach_the_drivers_streams_prefixed_whole_and_once(tmp_path, capsys):
    out, err = tmp_path / f"{WORKER}.out", tmp_path / f"{WORKER}.err"
    append(out, ":job_id:01000000\n:actor_name:HybridWorker\neasyr1: vLLM weight sync: the CPU path\npartial ")
    append(err, ":job_id:01000000\n:actor_name:HybridWorker\nWARNING something\n")
    append(tmp_path / "python-core-worker-a3d1_7862.log", "[core worker] not a worker's output\n")
    append(tmp_path / "gcs_server.err", "not forwarded either\n")
    forwarder = WorkerLogForwarder(tmp_path)

    forwarder.poll()
    captured = capsys.readouterr()
    assert captured.out == "(HybridWorker pid=7862) easyr1: vLLM weight sync: the CPU path\n"
    assert captured.err == "(HybridWorker pid=7862) WARNING something\n"

    forwarder.poll()  # nothing new: nothing printed again, the partial line still held back
    assert capsys.readouterr().out == ""
    append(out, "line\nnext")
    append(tmp_path / "raylet.err", "[raylet] a worker was killed: out of memory\n")
    forwarder.poll()
    captured = capsys.readouterr()
    assert captured.out == "(HybridWorker pid=7862) partial line\n"
    assert captured.err == "(raylet) [raylet] a worker was killed: out of memory\n"

    forwarder.start().stop()  # at exit: what is left, a last line without its newline too
    assert capsys.readouterr().out == "(HybridWorker pid=7862) next\n"


def test_a_task_worker_a_nameless_one_and_a_file_that_starts_again(tmp_path, capsys):
    task = tmp_path / "worker-ab-01000000-11.out"
    nameless = tmp_path / "worker-cd-01000000-12.out"
    append(task, ":task_name:score_batch\nscored 4 rows\n")
    append(nameless, "before any actor\n")
    forwarder = WorkerLogForwarder(tmp_path)
    forwarder.poll()
    assert capsys.readouterr().out == "(score_batch pid=11) scored 4 rows\n(pid=12) before any actor\n"

    task.write_text("new\n")  # rotated: shorter than what was read, so read from its start
    forwarder.poll()
    assert capsys.readouterr().out == "(score_batch pid=11) new\n"


def test_a_removed_log_directory_stops_nothing(tmp_path, capsys):
    forwarder = WorkerLogForwarder(tmp_path / "gone", interval=0.01).start()
    forwarder.stop()
    assert capsys.readouterr() == ("", "")
