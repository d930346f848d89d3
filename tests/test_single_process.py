"""``trainer.single_process=true``: the whole loop in one Python process, no Ray; the same numbers as Ray's.

The CPU demo config with one worker runs 5 steps twice, both in this process: with Ray made unimportable for the
run's duration (so no Ray process can start, and none does), and through Ray (with ``trainer.ray_timeline``). Every
metric that is a result, not a measurement of time, memory or bytes moved, must be equal bit for bit; the first lines
of the run say where its checkpoints, metrics and report go.
"""

from __future__ import annotations

import json
import sys

import psutil
import pytest
from helpers import ONE_PROCESS, train
from test_cli import base_args


pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.e2e]

STEPS = 5
# measurements, not results: they differ between any two runs
MEASURED = ("timing/", "perf/", "throughput/")


def results(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{key: value for key, value in record.items() if not key.startswith(MEASURED)} for record in records]


def test_one_process_without_ray_gives_a_one_worker_ray_runs_metrics(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, monkeypatch, rank_environment
):
    args = [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), "trainer.n_gpus_per_node=1"]
    args.append(f"trainer.max_steps={STEPS}")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
        children = {child.pid for child in psutil.Process().children(recursive=True)}
        single = train([*args, *ONE_PROCESS, f"trainer.save_checkpoint_path={tmp_path / 'single'}"])
        assert {child.pid for child in psutil.Process().children(recursive=True)} <= children  # nothing started
    assert single.returncode == 0, single.stderr[-3000:]
    first_lines = single.stdout.splitlines()[:3]
    assert first_lines == [
        f"easyr1: checkpoints: {tmp_path / 'single'}",
        f"easyr1: metrics: {tmp_path / 'single' / 'metrics.jsonl'}",
        f"easyr1: report: python -m easyr1.tools.report {tmp_path / 'single'}",
    ]
    assert "1 worker in this process" in single.stdout
    assert f"step {STEPS}/{STEPS}" in single.stdout

    timeline = tmp_path / "timeline.json"
    on_ray_run = train([*args, f"trainer.save_checkpoint_path={tmp_path / 'ray'}", f"trainer.ray_timeline={timeline}"])
    assert on_ray_run.returncode == 0, on_ray_run.stderr[-3000:]
    on_ray, in_process = results(tmp_path / "ray"), results(tmp_path / "single")
    assert [record["step"] for record in in_process] == list(range(1, STEPS + 1))
    assert in_process == on_ray
    assert len({record["actor/pg_loss"] for record in on_ray}) > 1  # the steps differ: the equality says something
    # Ray's timeline of the run: the workers' calls (split calls within a step go through the sample cache). The
    # timeline is the whole cluster's, shared with the session's other tests, so it shows what ran, not what did not
    # (the reward function runs in the driver's child process here: test_reward_timeout.py checks the scorer chosen)
    names = {event.get("name") for event in json.loads(timeline.read_text())}
    assert {"init_models", "run_with_sample_cache"} <= names, names
