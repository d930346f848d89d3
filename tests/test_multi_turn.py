"""The multi-turn stage without workers: a scripted policy plays real environments, and the trajectories it builds
are checked token by token (pieces, masks, positions, rewards), against the actor's loss (environment tokens never
count), and on bad environments (errors name the episode's seed and turn)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from agent_envs import COLOURS, ColourEnv
from helpers import demo_config
from PIL import Image
from test_on_policy_shortcut import build_actor

from easyr1.envs import ENVIRONMENTS, Observation
from easyr1.errors import EnvError
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.models.rope import MRopeSettings, get_rope_index
from easyr1.protocol import Batch
from easyr1.stages import multi_turn
from easyr1.stages.multi_turn import EpisodeSeeds, MultiTurnStage
from easyr1.stages.turn_encoding import TurnEncoder


class ScriptedRollout(MultiTurnStage):
    """The stage with its engine calls replaced by a fixed policy: episode seed s answers ``script(seed, turn)``."""

    def __init__(self, config, tokenizer, processor, model_config, script) -> None:
        super().__init__(config, None, tokenizer, processor, model_config)
        self.script = script
        self.turn_of: dict[int, int] = {}
        self.seen_prompts: list[list[int]] = []

    def _generate(self, live, row_seeds, sampling):
        prompts = self._turn_prompts(live)
        rows, log_probs = [], []
        for row, episode in enumerate(live):
            self.seen_prompts.append(prompts["input_ids"][row][prompts["attention_mask"][row].bool()].tolist())
            turn = len(episode.turns)
            ids = self.tokenizer.encode(self.script(episode.seed, turn), add_special_tokens=False)
            ids = ids[: sampling["max_tokens"]]
            rows.append(ids)
            log_probs.append([-0.5 - 0.01 * k for k in range(len(ids))])
        width = sampling["max_tokens"]
        responses = torch.zeros((len(live), width), dtype=torch.long)
        mask = torch.zeros((len(live), width), dtype=torch.long)
        lps = torch.zeros((len(live), width))
        for row, (ids, lp) in enumerate(zip(rows, log_probs)):
            responses[row, : len(ids)], mask[row, : len(ids)], lps[row, : len(ids)] = (
                torch.tensor(ids),
                1,
                torch.tensor(lp),
            )
        return Batch(tensors={"responses": responses, "response_mask": mask, "rollout_log_probs": lps})

    def _sleep_engines(self) -> None:
        pass


@pytest.fixture(scope="module")
def model_parts(tiny_qwen2_5_vl_dir):
    tokenizer, processor = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    return tokenizer, processor, load_model_config(str(tiny_qwen2_5_vl_dir))


def make_stage(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, script, *overrides, env_kwargs="{}"):
    ENVIRONMENTS.register("test_colour")(ColourEnv)
    config = demo_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        "env.name=test_colour",
        f"env.env_kwargs={env_kwargs}",
        "env.max_turns=3",
        "env.max_tokens_per_turn=4",
        "data.max_prompt_length=64",
        "data.max_response_length=80",
        "worker.rollout.n=2",
        "worker.rollout.max_model_len=160",
        *overrides,
    )
    return ScriptedRollout(config, *model_parts, script)


def answer_on_turn(k: int):
    """A policy that answers wrong until turn k (then right, ending the episode): 'red' is right for seed s turn t
    when (s + t) % 4 == 0."""

    def script(seed: int, turn: int) -> str:
        right = list(COLOURS)[(seed + turn) % 4]
        return f" {right}<|im_end|>" if turn >= k else " nothing"

    return script


def test_pieces_concatenate_to_the_chat_template_conversation(model_parts):
    tokenizer, processor, _ = model_parts
    from easyr1.data.vision import vision_bounds

    encoder = TurnEncoder(tokenizer, processor, vision_bounds(processor, 3136, 3136))
    image = Image.new("RGB", (56, 56), (255, 0, 0))
    first = encoder.first("Sys.", Observation("<image>", [image]), "test")
    answer = tokenizer.encode(" red<|im_end|>", add_special_tokens=False)
    second = encoder.next(Observation("<image>again", [image]), ended_with_eos=True, where="test")
    cut_off = encoder.next(Observation("<image>again", [image]), ended_with_eos=False, where="test")
    whole = processor.apply_chat_template(
        [
            {"role": "system", "content": "Sys."},
            {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": " red"},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "again"}]},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert first.raw_ids + answer + second.raw_ids == tokenizer.encode(whole, add_special_tokens=False)
    assert cut_off.raw_ids == tokenizer.encode("<|im_end|>", add_special_tokens=False) + second.raw_ids
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for piece in (first, second):  # the expanded ids are the raw ids with the one pad per image grown to 4
        assert piece.ids.count(image_pad) == 4 and piece.raw_ids.count(image_pad) == 1
        assert [t for t in piece.ids if t != image_pad] == [t for t in piece.raw_ids if t != image_pad]
        assert piece.vision["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_trajectory_is_one_sequence_with_only_model_tokens_in_the_loss(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts
):
    tokenizer = model_parts[0]
    stage = make_stage(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(2))
    rollout = stage.collect(EpisodeSeeds(5, None, 2).next(), step=1)
    batch, rewards = rollout.batch, rollout.rewards.result()
    assert len(batch) == 4 and list(batch["uid"]) == ["1-0", "1-0", "1-1", "1-1"]
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    settings = MRopeSettings.from_model_config(model_parts[2])
    for row in range(len(batch)):
        episode = batch["episode"][row]
        assert [turn["reward"] for turn in episode["turns"]] == [-0.1, -0.1, 1.0]  # invalid, invalid, right
        assert episode["success"] and [t["observation_images"] for t in episode["turns"]] == [1, 1, 1]
        valid = batch["attention_mask"][row].bool()
        ids = batch["input_ids"][row][valid]
        # every turn's prompt was the trajectory so far, token for token
        prompt_length = int(batch["attention_mask"][row, : batch["prompts"].shape[1]].sum())
        response_valid = valid[batch["prompts"].shape[1] :]
        loss = batch["response_mask"][row].bool()
        assert (loss & ~response_valid).sum() == 0
        model_tokens = batch["responses"][row][loss]
        script = answer_on_turn(2)
        turns = [tokenizer.encode(script(int(episode["seed"]), t), add_special_tokens=False)[:4] for t in range(3)]
        expected = sum(turns, [])
        assert model_tokens.tolist() == expected
        # environment tokens: the two later observations (each with one image) never count in the loss
        environment = batch["responses"][row][response_valid & ~loss]
        assert environment.tolist().count(image_pad) == 8 and image_pad not in model_tokens.tolist()
        assert ids[:prompt_length].tolist().count(image_pad) == 4
        # turn ids and rewards on each turn's last token
        turn_ids = batch["turn_ids"][row]
        assert set(turn_ids[loss].tolist()) == {0, 1, 2} and (turn_ids[~loss] == -1).all()
        scores = batch["token_level_scores"][row]
        ends = [int((turn_ids == t).nonzero().max()) for t in range(3)]
        assert scores[ends].tolist() == pytest.approx([-0.1, -0.1, 1.0]) and scores.abs().sum() == pytest.approx(1.2)
        assert rewards.scores[row].item() == pytest.approx(0.8)
        # log-probs from the engine on model tokens only; m-rope positions over all three images
        assert (batch["rollout_log_probs"][row][~loss] == 0).all() and (
            batch["rollout_log_probs"][row][loss] < 0
        ).all()
        grid = batch["multi_modal_inputs"][row]["image_grid_thw"]
        assert grid.shape[0] == 3
        positions = get_rope_index(
            batch["input_ids"][row], settings, grid, attention_mask=batch["attention_mask"][row]
        )
        torch.testing.assert_close(batch["position_ids"][row, 1:], positions)
    # the third turn's prompt (trajectory so far) is a prefix of the final sequence
    final = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert any(len(p) > 60 and final[: len(p)] == p for p in stage.seen_prompts)
    assert rollout.metrics["env/success_rate"] == 1.0 and rollout.metrics["env/turns"] == 3.0
    assert rollout.metrics["env/invalid_action_rate"] == pytest.approx(2 / 3)


def test_environment_tokens_never_change_the_loss(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, process_group):
    """Perturb old / reference log-probs, advantages and rollout-correction weights on environment tokens: the
    actor's loss, metrics and gradients stay the same; the same perturbation on a model token changes them."""
    stage = make_stage(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(1))
    batch = stage.collect(EpisodeSeeds(2, None, 2).next(), step=1).batch
    config = demo_config(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, "algorithm.disable_kl=false", "algorithm.use_kl_loss=true"
    ).worker.actor
    config.entropy_coeff = 0.01
    config.share_prompt = False  # as the trainer sets it for agent runs: observations put images in the responses
    view = batch.select("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
    view = view.union(Batch(non_tensors={"multi_modal_inputs": batch["multi_modal_inputs"]}))
    torch.manual_seed(0)
    view["advantages"] = torch.randn(batch["responses"].shape)
    view["old_log_probs"] = -torch.rand(batch["responses"].shape)
    view["ref_log_probs"] = -torch.rand(batch["responses"].shape)
    view["rollout_is_weights"] = 0.5 + torch.rand(batch["responses"].shape)

    def update(perturbed: Batch) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        actor, gradients = build_actor(tiny_qwen2_5_vl_dir, config)
        return actor.update_policy(perturbed, 1.0, len(perturbed)), gradients

    reference_metrics, reference_gradients = update(view)
    loss_mask = batch["response_mask"].bool()
    environment = batch["attention_mask"][:, batch["prompts"].shape[1] :].bool() & ~loss_mask
    assert environment.sum() > 20

    def perturbed_at(where: torch.Tensor) -> Batch:
        copy = view.union(Batch())
        for key in ("advantages", "old_log_probs", "ref_log_probs", "rollout_is_weights"):
            copy[key] = view[key].clone()
            copy[key][where] += 3.0
        return copy

    metrics, gradients = update(perturbed_at(environment))
    assert metrics == reference_metrics
    for name, gradient in reference_gradients.items():
        torch.testing.assert_close(gradients[name], gradient, rtol=0, atol=0, msg=name)
    one_model_token = torch.zeros_like(loss_mask)
    one_model_token[0, int(loss_mask[0].nonzero()[0])] = True
    metrics, gradients = update(perturbed_at(one_model_token))
    assert metrics["actor/pg_loss"] != reference_metrics["actor/pg_loss"]


def test_invalid_actions_are_counted_and_penalised(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts):
    stage = make_stage(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, lambda seed, turn: "<|im_end|>", "env.format_penalty=-0.25"
    )
    rollout = stage.collect(EpisodeSeeds(0, None, 1).next(), step=3)
    assert rollout.metrics["env/invalid_action_rate"] == 1.0 and rollout.metrics["env/success_rate"] == 0.0
    assert rollout.rewards.result().scores.tolist() == pytest.approx([-0.75, -0.75])
    assert rollout.batch["episode"][0]["turns"][0]["action_valid"] is False


def test_a_trajectory_that_would_not_fit_ends_cleanly_and_is_counted(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts
):
    # 40 response tokens: one turn (4) and one observation (~26) fit, a second observation would not
    stage = make_stage(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(5), "data.max_response_length=40"
    )
    rollout = stage.collect(EpisodeSeeds(0, None, 1).next(), step=1)
    assert rollout.metrics["env/truncated_rate"] == 1.0
    batch = rollout.batch
    used = batch["attention_mask"][:, batch["prompts"].shape[1] :].sum(dim=-1)
    assert (used <= 40).all() and (used > 4).all()
    assert all(len(episode["turns"]) == 2 for episode in batch["episode"])


@pytest.mark.parametrize(
    "fail, message",
    [
        ("raise", r"episode seed 7, turn 1: step\(\) raised RuntimeError: board exploded"),
        ("type", r"episode seed 7, turn 1: step\(\) must return \(observation, reward, done, info\)"),
        ("markers", r"episode seed 7, turn 1: the observation's text has 2 <image> marker\(s\) but 1 image"),
        ("hang", r"episode seed 7, turn 1: step\(\) did not return within"),
        ("nan", r"episode seed 7, turn 1: step\(\) returned the reward nan; it must be a finite number"),
    ],
)
def test_a_misbehaving_environment_stops_the_run_naming_the_episode(
    tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, monkeypatch, fail, message
):
    monkeypatch.setattr(multi_turn, "STEP_TIMEOUT_SECONDS", 0.5)
    stage = make_stage(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(5), env_kwargs=f"{{fail: {fail}}}"
    )
    with pytest.raises(EnvError, match=message):
        stage.collect(EpisodeSeeds(7, None, 1).next(), step=1)


def test_episode_seeds_cycle_and_resume():
    seeds = EpisodeSeeds(10, 3, 2)
    assert seeds.steps_per_epoch == 1
    drawn = [list(seeds.next()["env_seed"]) for _ in range(2)]
    assert drawn == [[10, 11], [12, 10]]
    resumed = EpisodeSeeds(10, 3, 2)
    resumed.load_state_dict(seeds.state_dict())
    assert list(resumed.next()["env_seed"]) == list(seeds.next()["env_seed"]) == [11, 12]
    assert list(EpisodeSeeds(0, None, 3).next()["env_seed"]) == [0, 1, 2]


def test_shuffled_images_come_from_other_episodes_and_are_seeded(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts):
    """env.shuffle_images (the image-blind control): each observation shows another episode's image, the same ones
    again when the step is replayed; the texts and everything else stay."""

    def first_colours(stage) -> list[tuple[int, ...]]:
        batch = stage.collect(EpisodeSeeds(0, None, 4).next(), step=2).batch
        return [batch["multi_modal_data"][row]["images"][0].getpixel((0, 0)) for row in range(len(batch))]

    own = first_colours(make_stage(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(0)))
    assert own == [COLOURS[list(COLOURS)[seed % 4]] for seed in range(4) for _ in range(2)]
    control = make_stage(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(0), "env.shuffle_images=true"
    )
    shuffled = first_colours(control)
    assert sorted(shuffled) == sorted(own) and shuffled != own
    assert first_colours(control) == shuffled


def test_latest_context_makes_each_turn_its_own_row(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts):
    """env.context=latest: every turn is generated from the system prompt and its observation only, and becomes a
    row of its own (prompt = that window, response = the turn, its reward on its last token); turns an episode did
    not play are padding rows with nothing to train on; the episode's first row carries its record and images."""
    tokenizer, processor, model_config = model_parts
    stage = make_stage(tiny_qwen2_5_vl_dir, tiny_dataset_dir, model_parts, answer_on_turn(1), "env.context=latest")
    rollout = stage.collect(EpisodeSeeds(5, None, 2).next(), step=1)
    batch, rewards = rollout.batch, rollout.rewards.result()
    assert len(batch) == 4 * 3  # 2 seeds x 2 episodes, max_turns rows each
    assert batch["episode_index"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert list(batch["uid"]) == ["1-0"] * 6 + ["1-1"] * 6
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    settings = MRopeSettings.from_model_config(model_config)
    encoder = stage.encoder
    script = answer_on_turn(1)
    prompt_width = batch["prompts"].shape[1]
    for episode_number in range(4):
        seed = 5 + episode_number // 2
        rows = [episode_number * 3 + turn for turn in range(3)]
        record = batch["episode"][rows[0]]
        assert record["seed"] == seed and [turn["reward"] for turn in record["turns"]] == [-0.1, 1.0]
        assert batch["episode"][rows[1]] is None and batch["episode"][rows[2]] is None
        assert len(batch["episode_images"][rows[0]]) == 2 and batch["episode_images"][rows[1]] is None
        env = ColourEnv()
        observations = [env.reset(seed)]
        observations.append(env.step(" nothing")[0])
        for turn, row in enumerate(rows[:2]):
            window = encoder.first("Name the colour.", observations[turn], "test")
            prompt = batch["prompts"][row][batch["attention_mask"][row, :prompt_width].bool()]
            assert prompt.tolist() == window.ids and prompt.tolist().count(image_pad) == 4
            assert window.ids in stage.seen_prompts  # what the engine saw is what the actor trains on
            assert list(batch["raw_prompt_ids"][row]) == window.raw_ids
            loss = batch["response_mask"][row].bool()
            expected = tokenizer.encode(script(seed, turn), add_special_tokens=False)[:4]
            assert batch["responses"][row][loss].tolist() == expected
            assert loss[: len(expected)].all() and not loss[len(expected) :].any()
            assert batch["attention_mask"][row, prompt_width:].tolist() == loss.long().tolist()
            assert (batch["turn_ids"][row][loss] == turn).all() and (batch["turn_ids"][row][~loss] == -1).all()
            scores = batch["token_level_scores"][row]
            assert scores[len(expected) - 1].item() == pytest.approx([-0.1, 1.0][turn]) and scores.count_nonzero() == 1
            assert rewards.scores[row].item() == pytest.approx([-0.1, 1.0][turn])
            assert batch["multi_modal_inputs"][row]["image_grid_thw"].tolist() == [[1, 4, 4]]
            positions = get_rope_index(
                batch["input_ids"][row],
                settings,
                batch["multi_modal_inputs"][row]["image_grid_thw"],
                attention_mask=batch["attention_mask"][row],
            )
            torch.testing.assert_close(batch["position_ids"][row, 1:], positions)
        padding = rows[2]  # the episode ended on turn 1: its third row holds nothing to train on
        assert batch["attention_mask"][padding].sum() == 1 and batch["response_mask"][padding].sum() == 0
        assert batch["token_level_scores"][padding].abs().sum() == 0 and rewards.scores[padding] == 0
        assert batch["multi_modal_inputs"][padding] == {}
    # no prompt the engine saw held an earlier turn: one image each, never a model's answer
    assert all(prompt.count(image_pad) == 4 for prompt in stage.seen_prompts) and len(stage.seen_prompts) == 8
    assert rollout.metrics["env/success_rate"] == 1.0 and rollout.metrics["env/turns"] == 2.0


def test_a_process_whose_environment_step_spins_still_exits():
    """The step that never returns is left in a daemon thread: once the run has stopped, the process exits (a thread
    pool's worker would be joined at exit, and the stopped run would never end)."""
    script = textwrap.dedent(
        """
        import sys
        from easyr1.user_code import CallTimedOut, call_with_time_limit

        def spin():
            while True:
                pass

        try:
            call_with_time_limit(spin, (), 0.2)
        except CallTimedOut:
            sys.exit(2)
        """
    )
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=120
    )
    assert result.returncode == 2
