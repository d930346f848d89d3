"""``async_training.schedule=one_step_off`` on a 1 + 1 split placement: staleness, the weight push, exact resume.

One uninterrupted 4-step run (a checkpoint at step 2, validation after step 4) and one run resumed from its step 2
are shared by the Ray tests; the HF engine (its model copy is what the checksum reads, and it starts faster than vLLM
on CPU). Both runs also score with a classifier on a worker of its own (``worker.reward_model.placement=standalone``,
the only placement a split run can host it on): its scores are logged and resume exactly too. The kill -9 version
of the resume is in ``bench/faults_kill_sweep.py``'s reach, not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, start_ray

from easyr1.config import load_config
from easyr1.errors import ConfigError
from easyr1.workers.hybrid_worker import HybridWorker


SPLIT = [
    "async_training.schedule=one_step_off",
    "async_training.placement=split",
    "async_training.generator_workers=1",
    "worker.rollout.name=hf",
]
# measurements of the machine, not of the run: wall times, memory, and the schedule's shares of wall time
MEASURED = ("timing/", "throughput/", "perf/", "async/trainer_wait_ratio", "async/generator_idle_ratio")


@dataclass
class SplitRun:
    """What a run left: each step's metrics, and the weight checksums of both groups after it ended."""

    history: list[dict[str, float]]
    trainer_checksums: list[float]
    generator_checksums: list[float]
    push: dict[str, list[dict[str, float]]]


def run_split(args: list[str]) -> SplitRun:
    """Train as ``easyr1.main`` does (driver seeded, inputs read, Ray up, trainer built), keeping every step's
    metrics and reading both groups' weights before the workers stop."""
    from easyr1.build import build_trainer, read_inputs
    from easyr1.seeding import seed_everything

    config = load_config(args)
    seed_everything(config.trainer.seed)
    inputs = read_inputs(config)
    start_ray()
    trainer = build_trainer(config, inputs)
    try:
        history = trainer.fit(keep_history=True)
        trainer_checksums = trainer.workers.run_all(HybridWorker.weights_checksum)
        generator_checksums = trainer.stage.generators.run_all(HybridWorker.weights_checksum)
        return SplitRun(history, trainer_checksums, generator_checksums, trainer.stage.push_results)
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def split_runs(tiny_qwen2_5_vl_dir: Path, tiny_dataset_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(uninterrupted 4 steps, resumed from its step 2 to step 4)."""
    from easyr1.tools.tiny_judge import build_tiny_judge

    root = tmp_path_factory.mktemp("one_step_off")
    classifier = build_tiny_judge(root / "classifier", "classifier", seed=2)
    args = [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
        f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
        f"data.val_files={tiny_dataset_dir / 'val.jsonl'}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=8",
        "worker.rollout.n=4",
        "trainer.max_steps=4",
        "trainer.save_freq=2",
        "trainer.val_freq=4",  # after the last step: the generators get the final weights first
        "trainer.logger=[file]",
        "worker.reward_model.kind=classifier",
        f"worker.reward_model.model_path={classifier}",
        "worker.reward_model.placement=standalone",
        *SPLIT,
    ]
    whole = run_split([*args, f"trainer.save_checkpoint_path={root / 'whole'}", f"trainer.log_dir={root / 'whole'}"])
    resumed = run_split(
        [
            *args,
            f"trainer.load_checkpoint_path={root / 'whole' / 'global_step_2'}",
            f"trainer.save_checkpoint_path={root / 'resumed'}",
            f"trainer.log_dir={root / 'resumed'}",
        ]
    )
    return whole, resumed


@pytest.mark.ray
def test_split_one_step_off_is_one_version_stale_and_pushes_the_trainers_weights(split_runs) -> None:
    whole, _ = split_runs
    assert len(whole.history) == 4
    ages = [(step["async/staleness/mean"], step["async/staleness/max"]) for step in whole.history]
    assert ages == [(0.0, 0.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    for step in whole.history:
        bad = {key: value for key, value in step.items() if not math.isfinite(value)}
        assert not bad, f"metrics not finite: {bad}"
        assert 0.0 <= step["async/trainer_wait_ratio"] <= 1.0
        assert 0.0 <= step["async/generator_idle_ratio"] <= 1.0
        assert step["perf/weight_push_bytes"] > 0
        assert step["reward_model/unparseable"] == 0.0 and step["reward_model/score_mean"] != 0.0
    # after the last step's validation push the generator's engine holds exactly the trainer's weights
    assert whole.generator_checksums[0] == pytest.approx(whole.trainer_checksums[0], rel=1e-12, abs=1e-9)
    sent, received = whole.push["sent"][0], whole.push["received"][0]
    assert (received["bytes"], received["tensors"]) == (sent["bytes"], sent["tensors"])
    assert received["checksum"] == sent["checksum"]


@pytest.mark.ray
def test_split_one_step_off_resumes_exactly(split_runs) -> None:
    whole, resumed = split_runs
    assert len(resumed.history) == 2  # steps 3 and 4

    def deterministic(metrics: dict[str, float]) -> dict[str, float]:
        return {key: value for key, value in metrics.items() if not key.startswith(MEASURED)}

    for uninterrupted, again in zip(whole.history[2:], resumed.history):
        assert deterministic(again) == deterministic(uninterrupted)


def test_split_placement_refusals(tiny_qwen2_5_vl_dir: Path, tiny_dataset_dir: Path) -> None:
    base = [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
        f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
        "async_training.schedule=one_step_off",
    ]
    with pytest.raises(ConfigError, match="placement=split"):
        load_config(base)  # one_step_off on colocated workers: nothing would overlap
    with pytest.raises(ConfigError, match="at least one generator and one trainer"):
        load_config([*base, "async_training.placement=split", "async_training.generator_workers=2"])
    # 16 prompts x 8 samples do not split over 3 trainers (the world-size check sees 4 workers and passes)
    with pytest.raises(ConfigError, match="over the 3 trainers"):
        load_config(
            [
                *base,
                "trainer.n_gpus_per_node=4",
                "async_training.placement=split",
                "async_training.generator_workers=1",
            ]
        )
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        load_config(
            [
                *base,
                "trainer.n_gpus_per_node=4",
                "async_training.placement=split",
                "async_training.generator_workers=1",
                "worker.rollout.tensor_parallel_size=2",
            ]
        )
