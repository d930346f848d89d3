"""An agent run killed with ``kill -9`` mid-run and resumed continues exactly: the same metrics per step and
bit-identical final weights as an uninterrupted run (the seed stream's position is in the checkpoint; environment
and sampling seeds are functions of the step). The runs are single-process: what an agent adds to resuming is the
driver's state; killing a Ray run's driver and its workers is ``test_resume_fault.py``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from helpers import ONE_PROCESS, train
from test_resume_fault import deterministic_metrics, kill_hard, start

from easyr1.checkpoint.manager import CheckpointDirectory
from easyr1.checkpoint.merge import load_model_state_dict


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]

REPO = Path(__file__).resolve().parents[1]
STEPS = 4


def agent_args(model_dir: Path, run_dir: Path) -> list[str]:
    """4 GRPO steps of 2 seeds x 4 episodes (3 turns, an image each), a checkpoint every 2 steps, in one process."""
    return [
        f"config={REPO / 'examples' / 'config_cpu.yaml'}",
        *ONE_PROCESS,
        f"worker.actor.model.model_path={model_dir}",
        "worker.reward.reward_function=null",
        f"env.env_class={REPO / 'tests' / 'agent_envs.py'}:ColourEnv",
        "env.max_turns=3",
        "env.max_tokens_per_turn=4",
        "env.num_seeds=6",  # 3 steps per epoch: the run crosses an epoch boundary
        "data.max_prompt_length=64",
        "data.max_response_length=96",
        "worker.rollout.max_model_len=160",
        "data.rollout_batch_size=2",
        "worker.actor.global_batch_size=2",
        "worker.rollout.n=4",
        "worker.actor.optim.lr=1e-3",
        f"trainer.max_steps={STEPS}",
        "trainer.save_freq=2",
        f"trainer.save_checkpoint_path={run_dir}",
    ]


def test_agent_run_killed_mid_run_resumes_exactly(tiny_qwen2_5_vl_dir, tmp_path):
    reference_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "interrupted"
    reference = train(agent_args(tiny_qwen2_5_vl_dir, reference_dir))  # in this process: not the point here
    assert reference.returncode == 0, reference.stderr[-4000:]
    expected = deterministic_metrics(reference_dir)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert all("env/success_rate" in metrics for metrics in expected.values())

    # killed while step 3 runs (step 2's checkpoint is committed, step 3's metrics not yet logged)
    args = agent_args(tiny_qwen2_5_vl_dir, run_dir)
    process = start(args, tmp_path / "run1.log")
    deadline = time.monotonic() + 600
    while not (run_dir / "global_step_2").exists():
        assert process.poll() is None, (tmp_path / "run1.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "step 2's checkpoint was never committed"
        time.sleep(0.01)
    time.sleep(0.5)
    kill_hard(process)
    assert CheckpointDirectory(run_dir).complete_steps() == [2]

    final = train(args)  # resumed to the end, in this process
    assert final.returncode == 0, final.stderr[-4000:]
    assert "resumed from" in final.stdout
    actual = deterministic_metrics(run_dir)
    assert sorted(actual) == list(range(1, STEPS + 1))
    for step in expected:
        assert actual[step] == expected[step], f"step {step} differs"
    expected_weights = load_model_state_dict(reference_dir / f"global_step_{STEPS}" / "actor")
    actual_weights = load_model_state_dict(run_dir / f"global_step_{STEPS}" / "actor")
    assert expected_weights.keys() == actual_weights.keys()
    for name, value in expected_weights.items():
        assert torch.equal(actual_weights[name], value), name
