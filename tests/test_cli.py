"""Bad input through the real command line: one clear message, no traceback, exit code 2, before any model loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

from easyr1.main import main


def base_args(model_dir, data_dir) -> list[str]:
    return [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        f"worker.actor.model.model_path={model_dir}",
        f"data.train_files={data_dir / 'train.jsonl'}",
        f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
    ]


def run_main(capsys, args: list[str]) -> str:
    """Run the CLI in-process; return stderr after checking the exit code and the absence of a traceback."""
    code = main(args)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err
    assert captured.err.startswith("easyr1: error: ")
    return captured.err


def run_cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m easyr1.main ARGS`` in a process of its own (not in the fast tier: mark the test ``e2e``)."""
    assert os.environ.get("EASYR1_TEST_TIER") != "fast", "a training subprocess in the fast tier: mark the test `e2e`"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "easyr1.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.e2e  # the CLI in a process of its own (it stops before Ray)
def test_unknown_key_through_the_real_cli(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    result = run_cli([*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), "worker.actor.global_batchsize=4"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "worker.actor.global_batchsize" in result.stderr
    assert "worker.actor.global_batch_size" in result.stderr  # the suggestion


def test_bad_type(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    err = run_main(capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), "data.rollout_batch_size=many"])
    assert "data.rollout_batch_size" in err and "many" in err


def test_indivisible_batch_sizes(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    err = run_main(capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), "data.rollout_batch_size=15"])
    assert "data.rollout_batch_size" in err and "15" in err


def test_missing_reward_file(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    missing = tmp_path / "nowhere.py"
    err = run_main(
        capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), f"worker.reward.reward_function={missing}:score"]
    )
    assert str(missing) in err and "worker.reward.reward_function" in err


def test_missing_reward_function(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    spec = f"{REPO / 'reward_function' / 'shape_color.py'}:no_such_function"
    err = run_main(
        capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), f"worker.reward.reward_function={spec}"]
    )
    assert "no_such_function" in err and "compute_score" in err  # names what the file does define


def test_row_without_prompt_key(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    rows = [json.loads(line) for line in (tiny_dataset_dir / "train.jsonl").read_text().splitlines()]
    del rows[3]["problem"]
    bad = tmp_path / "train.jsonl"
    bad.write_text(
        "".join(json.dumps({**row, "images": [str(tiny_dataset_dir / row["images"][0])]}) + "\n" for row in rows)
    )
    err = run_main(capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), f"data.train_files={bad}"])
    assert str(bad) in err and "problem" in err and "line 4" in err  # row index 3, the 4th line


def test_unreadable_image(capsys, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_dataset_dir, data)
    broken = data / json.loads((data / "train.jsonl").read_text().splitlines()[5])["images"][0]
    broken.write_bytes(b"this is not a png")
    err = run_main(capsys, [*base_args(tiny_qwen2_5_vl_dir, data), f"data.train_files={data / 'train.jsonl'}"])
    assert str(broken.name) in err and "5" in err


# a reward file that raises on every batch
RAISING_REWARD = (
    "def compute_score(reward_inputs):\n"
    "    return [{'overall': 1.0 / (len(item['response']) - len(item['response']))} for item in reward_inputs]\n"
)


@pytest.mark.vllm
@pytest.mark.e2e
def test_reward_function_that_raises_stops_the_run(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment):
    """The run's reward call raises: one message, exit code 2 (in one process; through Ray's reward actor the same
    error reaches the driver as it is: test_reward.py)."""
    from helpers import ONE_PROCESS, train

    reward = tmp_path / "bad_reward.py"
    reward.write_text(RAISING_REWARD)
    result = train(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            *ONE_PROCESS,
            f"worker.reward.reward_function={reward}:compute_score",
            "trainer.max_steps=1",
            f"trainer.save_checkpoint_path={tmp_path / 'run'}",
        ]
    )
    assert result.returncode == 2, result.stderr[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("easyr1: error: ")]
    assert len(error_lines) == 1
    assert "sample 0" in error_lines[0] and "ZeroDivisionError" in result.stderr


def test_help_lists_every_key_with_its_default_and_help(capsys):
    from easyr1.config import PPOConfig
    from easyr1.config.fields import is_section, iter_fields

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m easyr1.main config=FILE.yaml")
    listed = {line.split(":")[0] for line in out.splitlines()}
    keys = {key for key, _, hint in iter_fields(PPOConfig) if not is_section(hint)}
    assert keys <= listed, sorted(keys - listed)[:5]
    assert "worker.rollout.n: int = 5  # responses sampled per prompt" in out
    assert "trainer.single_process: bool = False  # run the whole loop in this one Python process" in out
