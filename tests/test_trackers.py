import json
import math

import pytest

from easyr1.errors import ConfigError
from easyr1.logging import build_trackers
from easyr1.logging.trackers import ConsoleTracker, FileTracker


def test_file_tracker_writes_one_json_object_per_step(tmp_path):
    tracker = FileTracker(tmp_path / "run")
    tracker.log({"reward/overall": 0.5, "actor/grad_norm": float("nan")}, step=1)
    tracker.log({"reward/overall": 0.75}, step=2)
    tracker.close()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [record["step"] for record in records] == [1, 2]
    assert records[0]["reward/overall"] == 0.5 and records[1]["reward/overall"] == 0.75
    assert math.isnan(float(records[0]["actor/grad_norm"]))


def test_resumed_run_continues_the_file_from_its_resume_step(tmp_path):
    tracker = FileTracker(tmp_path)
    for step in range(1, 5):
        tracker.log({"a": float(step)}, step=step)
    tracker.close()
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 5, "a": ')  # a line cut short by a kill
    tracker = FileTracker(tmp_path, resume_step=2)
    for step in (3, 4):
        tracker.log({"a": 10.0 * step}, step=step)
    tracker.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["a"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    (earlier,) = [path for path in tmp_path.iterdir() if path.name != "metrics.jsonl"]
    assert len(earlier.read_text().splitlines()) == 5  # the interrupted run's file is kept whole


def test_runs_in_the_same_second_keep_every_earlier_file(tmp_path):
    for value in range(3):
        tracker = FileTracker(tmp_path)
        tracker.log({"a": float(value)}, step=1)
        tracker.close()
    kept = sorted(json.loads(path.read_text())["a"] for path in tmp_path.iterdir() if path.name != "metrics.jsonl")
    assert kept == [0.0, 1.0]


def test_new_run_keeps_the_old_file_aside(tmp_path):
    for value in (1.0, 2.0):
        tracker = FileTracker(tmp_path)
        tracker.log({"a": value}, step=1)
        tracker.close()
    kept = [path for path in tmp_path.iterdir() if path.name != "metrics.jsonl"]
    assert len(kept) == 1 and json.loads(kept[0].read_text())["a"] == 1.0
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["a"] == 2.0


def test_console_tracker_prints_headline_numbers():
    lines = []
    ConsoleTracker(print_fn=lambda text, flush: lines.append(text)).log(
        {"reward/overall": 0.25, "timing/step": 1.5, "unlisted": 3.0}, step=7
    )
    assert lines == ["step 7 | reward 0.25 | s/step 1.5"]


def test_unknown_tracker_is_a_config_error(tmp_path):
    assert len(build_trackers(["console", "file"], tmp_path)) == 2
    with pytest.raises(ConfigError, match="trainer.logger"):
        build_trackers(["nope"], tmp_path)
