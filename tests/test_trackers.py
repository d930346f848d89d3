import json
import math

import pytest

from easyr1.errors import ConfigError
from easyr1.logging import build_trackers
from easyr1.logging.trackers import ConsoleTracker, FileTracker, duration_text


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


def test_console_line_says_the_step_out_of_the_total_and_the_time_left():
    lines, now = [], [100.0]
    console = ConsoleTracker(print_fn=lambda text, flush: lines.append(text), total_steps=10, clock=lambda: now[0])
    console.log({"val/reward_score": 0.5}, step=0)  # validation before training: no time left yet
    for seconds, step in ((5.0, 1), (10.0, 2), (20.0, 3)):  # wall time between lines: validation, saving included
        now[0] += seconds
        console.log({"timing/step": 1.0}, step=step)
    assert lines[0] == "step 0/10 | val_reward 0.5"
    assert lines[1] == "step 1/10 | s/step 1 | 45s left"  # 9 steps of 5 s
    assert lines[2] == "step 2/10 | s/step 1 | 1m00s left"  # 8 steps of the mean of (5, 10)
    assert lines[3] == "step 3/10 | s/step 1 | 1m22s left"  # 7 steps of the mean of (5, 10, 20)
    resumed, later = [], ConsoleTracker(print_fn=lambda text, flush: resumed.append(text), total_steps=10)
    later.log({"timing/step": 4.0}, step=5)  # a process's first line: its step's own time
    assert resumed == ["step 5/10 | s/step 4 | 20s left"]
    assert duration_text(3 * 3600 + 5 * 60 + 9) == "3h05m" and duration_text(59.6) == "1m00s"


def test_unknown_tracker_is_a_config_error(tmp_path):
    assert len(build_trackers(["console", "file"], tmp_path)) == 2
    with pytest.raises(ConfigError, match="trainer.logger"):
        build_trackers(["nope"], tmp_path)


# ---------------------------------------------------------------- the optional libraries, each in its offline mode
STEPS = {1: {"reward/overall": 0.25, "actor/pg_loss": -0.5}, 2: {"reward/overall": 0.75, "actor/pg_loss": 0.125}}
CONFIG = {"algorithm": {"adv_estimator": "grpo"}, "data": {"rollout_batch_size": 16}}


def log_steps(name: str, log_dir) -> None:
    (tracker,) = build_trackers([name], log_dir, project="proj", experiment="exp", config=CONFIG)
    for step, metrics in STEPS.items():
        tracker.log(metrics, step)
    tracker.close()


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_steps("tensorboard", tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for key in ("reward/overall", "actor/pg_loss"):
        assert [(event.step, event.value) for event in events.Scalars(key)] == [
            (step, pytest.approx(metrics[key])) for step, metrics in STEPS.items()
        ]


def test_mlflow_local_file_store_reads_back(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_steps("mlflow", tmp_path)
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp" and run.data.params["algorithm.adv_estimator"] == "grpo"
    history = client.get_metric_history(run.info.run_id, "reward/overall")
    assert [(metric.step, metric.value) for metric in history] == [(1, 0.25), (2, 0.75)]


def read_wandb_history(run_file) -> list[dict]:
    """History rows of an offline wandb run file (a LevelDB-style log of protobuf records)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, header = run_file.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    rows, position, pending = [], header, b""
    while position + header <= len(data):
        if block - position % block < header:  # block padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + header])
        if kind == 0 and length == 0:
            break
        chunk, position = data[position + header : position + header + length], position + header + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                items = record.history.item  # "a/b" keys are stored split, as nested keys
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps("wandb", tmp_path)
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = read_wandb_history(run_file)
    assert [(row["_step"], row["reward/overall"], row["actor/pg_loss"]) for row in rows] == [
        (step, metrics["reward/overall"], metrics["actor/pg_loss"]) for step, metrics in STEPS.items()
    ]


def test_swanlab_offline_run_reads_back(tmp_path, monkeypatch):
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    monkeypatch.setenv("SWANLAB_MODE", "offline")
    log_steps("swanlab", tmp_path)
    (run_file,) = (tmp_path / "swanlab").glob("run-*/run-*.swanlab")
    reader, scalars = DataStoreReader(), []
    reader.open(run_file)
    while (data := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "scalar":
            scalars.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
    reader.close()
    expected = [(key, step, value) for step, metrics in STEPS.items() for key, value in metrics.items()]
    assert sorted(scalars) == sorted(expected)


def test_missing_library_gives_an_install_hint(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an uninstalled package looks like to import
    with pytest.raises(ConfigError, match="pip install wandb"):
        build_trackers(["wandb"], tmp_path)
