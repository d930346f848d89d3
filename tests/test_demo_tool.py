import json
from pathlib import Path

import pytest

from easyr1.tools.demo import summarize, write_shuffled_copy


def test_summarize_uses_the_first_and_last_tenth():
    history = [{"reward/overall": float(step)} for step in range(20)]
    assert summarize(history) == (pytest.approx(0.5), pytest.approx(18.5))  # 2 steps each
    assert summarize(history[:3]) == (0.0, 2.0)  # at least one step each


def test_shuffled_copy_keeps_prompts_and_answers_but_moves_images(tiny_dataset_dir, tmp_path):
    source = tiny_dataset_dir / "train.jsonl"
    original = [json.loads(line) for line in source.read_text().splitlines()]
    shuffled = [
        json.loads(line) for line in write_shuffled_copy(str(source), tmp_path, seed=1).read_text().splitlines()
    ]
    assert [row["answer"] for row in shuffled] == [row["answer"] for row in original]
    assert [row["problem"] for row in shuffled] == [row["problem"] for row in original]
    original_images = [str((source.parent / row["images"][0]).resolve()) for row in original]
    new_images = [row["images"][0] for row in shuffled]
    assert sorted(new_images) == sorted(original_images)  # the same images, each once
    moved = sum(new != old for new, old in zip(new_images, original_images))
    assert moved > 0.9 * len(original)
    assert all(Path(image).exists() for image in new_images)


@pytest.mark.parametrize("schedule", ["sync", "one_step_off", "partial_rollout"])
def test_each_demo_schedule_loads_on_the_demo_config(schedule):
    """``--schedule`` sets keys the config checks accept on the demo's two workers (one_step_off: 1 + 1 split)."""
    from easyr1.config import load_config
    from easyr1.tools.demo import DEMO_CONFIG, schedule_overrides

    config = load_config([f"config={DEMO_CONFIG}", *schedule_overrides(schedule)])
    assert config.async_training.schedule == schedule
    expected = ("split", 1) if schedule == "one_step_off" else ("colocated", 0)
    assert (config.async_training.placement, config.async_training.generator_workers) == expected


def test_schedule_is_refused_for_the_agent_demo(capsys):
    from easyr1.tools.demo import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "target", "--schedule", "one_step_off"])
    assert exit_info.value.code == 2 and "--schedule trains the shape demo" in capsys.readouterr().err
