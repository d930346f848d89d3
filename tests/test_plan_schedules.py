"""The plan under the asynchronous schedules: a split placement's two kinds of worker and its overlapped step, and
partial rollout's larger pool in the engine."""

from __future__ import annotations

import pytest
from test_plan import CPU, cpu_config, plan_for

from easyr1.plan.hardware import gpu_device
from easyr1.plan.reference_models import write_reference_model


SPLIT = ("async_training.schedule=one_step_off", "async_training.placement=split")


def test_split_shards_over_the_trainers_and_overlaps_generation_with_training(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    base = cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "trainer.n_gpus_per_node=4")
    split = cpu_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        "trainer.n_gpus_per_node=4",
        *SPLIT,
        "async_training.generator_workers=2",
    )
    together, apart = plan_for(base), plan_for(split)
    # the models are sharded over the 2 trainers instead of all 4 workers: twice the bytes per worker
    assert apart.states["actor"].param_bytes == pytest.approx(2 * together.states["actor"].param_bytes, rel=0.02)
    generator = [phase for phase in apart.phases if phase.name.startswith("generation")]
    assert [item for item, _ in generator[0].items] == ["rollout engine"]  # a generator holds the engine alone
    assert all("engine" not in item for phase in apart.phases[1:] for item, _ in phase.items)
    # one engine per generator serves the whole batch: twice the rows of a colocated engine
    assert apart.engine.rows == 2 * together.engine.rows
    # the slower side sets the step: generation on 2 generators or the passes on 2 trainers, not their sum
    flops, rate = apart.flops, CPU.peak_flops * apart.mfu
    expected = max(flops.generation / (2 * rate), (flops.log_probs + flops.updates) / (2 * rate))
    assert apart.step_seconds == pytest.approx(expected)
    assert apart.step_seconds < together.step_seconds * 2
    assert any("placement=split" in note for note in apart.notes)


def test_partial_rollout_sizes_the_engine_for_its_pool(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    sync = plan_for(cpu_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir))
    pool = plan_for(
        cpu_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            "async_training.schedule=partial_rollout",
            "async_training.in_flight_prompts=48",
            "async_training.max_staleness=2",
        )
    )
    assert pool.engine.rows == 3 * sync.engine.rows  # 48 prompts generating against a batch of 16
    assert pool.engine.kv_bytes > sync.engine.kv_bytes
    assert any("partial_rollout" in note for note in pool.notes)


def test_split_plan_of_the_7b_recipe_on_h100(tmp_path):
    """On the GPU recipe the trainers' passes dominate: 4 trainers take longer than 8 colocated workers, and the
    plan says so rather than promising the overlap."""
    model = write_reference_model("qwen2.5-vl-7b", tmp_path / "model")
    overrides = ("config=examples/config.yaml", f"worker.actor.model.model_path={model}")
    from easyr1.config import load_config

    sync = plan_for(load_config([*overrides]), gpu_device("H100"))
    split = plan_for(load_config([*overrides, *SPLIT, "async_training.generator_workers=4"]), gpu_device("H100"))
    assert split.device_peak > sync.device_peak  # the states sharded over 4 instead of 8
    assert split.step_seconds > sync.step_seconds
