"""A tiny agent run end to end (FSDP2 on gloo, the engine, the trainer): two steps on vLLM over 2 Ray workers and on
the HF engine in one process, with an image on every turn, validation on held-out seeds, and the vLLM-vs-actor
log-prob gap of multi-turn image trajectories below 1e-3 in fp32; and on vLLM with each turn its own row
(env.context=latest), in one process."""

from __future__ import annotations

import json

import pytest
from agent_envs import ColourEnv
from helpers import ONE_PROCESS, demo_config, start_ray

from easyr1.envs import ENVIRONMENTS


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]


def agent_run(
    model_dir, data_dir, run_dir, engine: str, estimator: str, context: str, on_ray: bool
) -> tuple[list[dict[str, float]], list[dict], object]:
    """Two steps of 4 seeds x 4 episodes, 3 turns each, validation after the last; returns the metrics, the last
    step's episode records and the trainer's log directory."""
    from easyr1.build import build_trainer

    ENVIRONMENTS.register("test_colour")(ColourEnv)
    if on_ray:
        start_ray()
    config = demo_config(
        model_dir,
        data_dir,
        *([] if on_ray else ONE_PROCESS),
        "env.name=test_colour",
        "env.max_turns=3",
        "env.max_tokens_per_turn=4",
        "env.val_episodes=4",
        "data.max_prompt_length=64",
        "data.max_response_length=96",
        "worker.rollout.max_model_len=160",
        f"worker.rollout.name={engine}",
        f"algorithm.adv_estimator={estimator}",
        f"env.context={context}",
        "trainer.rollouts_to_log=2",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=4",
        "trainer.max_steps=2",
        "trainer.val_freq=2",
        "trainer.logger=[file]",
        f"trainer.save_checkpoint_path={run_dir}",
        "trainer.save_freq=-1",
        "trainer.save_model_only=true",
    )
    trainer = build_trainer(config)
    episodes: list[dict] = []
    method = "assemble" if context == "full" else "assemble_turn_rows"
    original = getattr(trainer.stage, method)

    def keep_episodes(finished):
        batch = original(finished)
        episodes[:] = [record for record in batch["episode"] if record is not None]
        return batch

    setattr(trainer.stage, method, keep_episodes)
    try:
        return trainer.fit(keep_history=True), episodes, trainer.log_dir
    finally:
        trainer.shutdown()


# GRPO on vLLM over 2 Ray workers (a turn's live episodes padded to a multiple of them); the turn-level GAE (with its
# critic) on the HF engine and GRPO with one row per turn, each in one process
@pytest.mark.parametrize(
    "engine, estimator, context, on_ray",
    [
        pytest.param("vllm", "grpo", "full", True, marks=pytest.mark.ray),
        ("hf", "turn_gae", "full", False),
        ("vllm", "grpo", "latest", False),
    ],
)
def test_two_agent_steps_with_images_on_every_turn(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, engine, estimator, context, on_ray
):
    history, episodes, log_dir = agent_run(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path / "run", engine, estimator, context, on_ray
    )
    assert len(history) == 2
    for step in history:
        # a sample is an episode, or (latest) one turn of one: the padding rows of shorter episodes are not counted
        samples = 16 if context == "full" else step["env/turns"] * 16
        assert step["batch/samples"] == pytest.approx(samples)
        assert 1.0 <= step["env/turns"] <= 3.0 and 0.0 <= step["env/success_rate"] <= 1.0
        assert step["env/tokens_per_turn"] > 0
        assert 0 < step["response_length/mean"] <= (12 if context == "full" else 4)  # model tokens of a sample
    assert "val/success_rate" in history[-1] and "val/reward_score" in history[-1]
    # several turns, each after an observation with its image
    long_ones = [episode for episode in episodes if len(episode["turns"]) >= 2]
    assert long_ones and all(turn["observation_images"] == 1 for e in long_ones for turn in e["turns"])
    if estimator == "turn_gae":  # the critic was trained on the trajectories
        assert all("critic/vf_loss" in step for step in history)
    if engine == "vllm":  # the engine's log-probs are the actor's, image turns included (fp32)
        assert max(step["rollout/log_prob_gap_max"] for step in history) < 1e-3
    # the rollout log shows each logged episode once, turn by turn, with its observation's image and its return
    logged = [json.loads(line) for line in (log_dir / "rollouts.jsonl").read_text().splitlines()]
    responses = [response for prompt in logged[-1]["prompts"] for response in prompt["responses"]]
    assert len(responses) == 2 * 4
    for response in responses:
        turns = response["episode"]["turns"]
        assert all(len(turn["images"]) == 1 for turn in turns)
        assert response["score"] == pytest.approx(sum(turn["reward"] for turn in turns))
