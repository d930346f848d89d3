"""The multi-turn rollout stage: episodes in environments, each trajectory one training sequence.

:class:`MultiTurnStage` implements :class:`~easyr1.stages.base.RolloutStage` for agent runs (the ``env``
section). A step's "prompts" are environment seeds (:class:`EpisodeSeeds`, one per group); every seed is played
``worker.rollout.n`` times. Turn by turn, every live episode of the step generates one turn on the workers (each
gets an equal consecutive chunk of the live episodes, through the same ``generate`` as single-turn runs, so weight
sync, tensor parallelism and the prompt-id check apply to every turn), the driver steps its environment with the
decoded text, and appends the next observation. An episode ends when the environment says done, after
``env.max_turns`` turns, or when another full turn would not fit ``data.max_response_length`` (counted as
truncated); a finished episode is left out of the next turns' batches.

The trajectory is one sequence: the prompt is the system prompt with the first observation (left-padded to
``data.max_prompt_length``); the response region holds the model's turns and the observations between them
(right-padded to ``data.max_response_length``). ``response_mask`` is 1 on the model's tokens only (the loss
never sees an environment token); ``attention_mask`` is 1 on every real token; ``turn_ids`` gives each model token
its turn (-1 elsewhere); ``token_level_scores`` holds each turn's reward (the environment's, plus
``env.format_penalty`` when it could not read an action) on the turn's last token, so that the trajectory's return
is the sample's score for GRPO / RLOO / REINFORCE++ and PPO's GAE sees each reward where it was earned.

With ``env.context=latest`` a turn is generated from the system prompt and its own observation only, and every turn
is its own training row (:meth:`MultiTurnStage.assemble_turn_rows`); the trainer gives all rows of an episode the
episode's advantage.

Seeds: the environment seeds come from the step (through :class:`EpisodeSeeds`, saved with the checkpoint), the
sampling seed of each (step, turn, episode) from ``worker.rollout.seed`` as in single-turn runs; episodes never
span steps, so a resumed run replays exactly.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from easyr1.algorithms import place_turn_rewards
from easyr1.config import PPOConfig
from easyr1.data.vision import vision_bounds
from easyr1.engines import engine_traits
from easyr1.envs import IMAGE_MARKER, Environment, Observation, build_environment
from easyr1.errors import EnvError
from easyr1.logging.timing import timed
from easyr1.models.families import family_of
from easyr1.models.loading import pad_token_id
from easyr1.models.rope import MRopeSettings, is_mrope_config, prompt_position_ids
from easyr1.protocol import Batch
from easyr1.reward import PendingRewards, Rewards
from easyr1.stages.base import ScoredSamples, Validation
from easyr1.stages.sampling import VALIDATION_ROUND, round_first_seed, sampling_settings, validation_overrides
from easyr1.stages.turn_encoding import Piece, TurnEncoder
from easyr1.user_code import CallTimedOut, call_with_time_limit
from easyr1.workers.hybrid_worker import HybridWorker


# Environment steps that take longer than this stop the run (an environment that hangs).
STEP_TIMEOUT_SECONDS = 300.0


class EpisodeSeeds:
    """The environment seeds an agent run trains on, one per group, with a position saved in checkpoints.

    Group ``k`` of the run plays seed ``first_seed + k``; with ``num_seeds`` the seeds cycle through
    ``[first_seed, first_seed + num_seeds)`` (an epoch is one pass), else they never repeat.
    """

    def __init__(self, first_seed: int, num_seeds: int | None, batch_size: int) -> None:
        self.first_seed, self.num_seeds, self.batch_size = first_seed, num_seeds, batch_size
        self.steps_per_epoch = (num_seeds // batch_size) if num_seeds else None
        self.groups_drawn = 0

    def next(self) -> Batch:
        """The next ``batch_size`` seeds, as a batch with one ``env_seed`` per row."""
        drawn = range(self.groups_drawn, self.groups_drawn + self.batch_size)
        self.groups_drawn += self.batch_size
        seeds = [self.first_seed + (k % self.num_seeds if self.num_seeds else k) for k in drawn]
        return Batch(non_tensors={"env_seed": np.array(seeds, dtype=object)})

    def state_dict(self) -> dict[str, int]:
        """The position: how many groups were drawn."""
        return {"groups_drawn": self.groups_drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position saved by :meth:`state_dict`."""
        self.groups_drawn = int(state["groups_drawn"])


@dataclass
class Turn:
    """One turn of an episode, as the report shows it."""

    text: str
    action: Any
    reward: float
    action_valid: bool
    tokens: int
    observation_images: int  # images of the observation the model saw before this turn (the trajectory's, in order)


@dataclass
class Episode:
    """An episode being played: its environment and the trajectory's tokens in both forms (see turn_encoding)."""

    seed: int
    uid: str
    env: Environment
    raw_ids: list[int]
    ids: list[int]
    prompt_length: int  # expanded tokens of the first piece (system prompt + first observation)
    raw_prompt_length: int  # the same piece's unexpanded tokens
    images: list[Image.Image]
    vision: list[dict[str, torch.Tensor]]
    system_prompt: str = ""
    windows: list[Piece] = field(default_factory=list)  # env.context=latest: the prompt each turn saw
    responses: list[list[int]] = field(default_factory=list)  # each turn's generated tokens
    response_log_probs: list[list[float]] = field(default_factory=list)  # their rollout log-probs
    loss_mask: list[int] = field(default_factory=list)  # over ids[prompt_length:]
    log_probs: list[float] = field(default_factory=list)  # over ids[prompt_length:]
    turn_ids: list[int] = field(default_factory=list)  # over ids[prompt_length:]
    turns: list[Turn] = field(default_factory=list)
    last_observation_images: int = 0
    done: bool = False
    success: bool = False
    truncated: bool = False

    @property
    def response_length(self) -> int:
        """Tokens after the first piece (model turns and later observations)."""
        return len(self.ids) - self.prompt_length

    def append(self, piece: Piece) -> None:
        """Add an observation piece: attended to, never trained on."""
        self.raw_ids += piece.raw_ids
        self.ids += piece.ids
        self.images += piece.images
        self.last_observation_images = len(piece.images)
        if piece.vision:
            self.vision.append(piece.vision)
        self.loss_mask += [0] * len(piece.ids)
        self.log_probs += [0.0] * len(piece.ids)
        self.turn_ids += [-1] * len(piece.ids)

    def merged_vision(self) -> dict[str, torch.Tensor]:
        """The processed tensors of all the trajectory's images, in order."""
        if not self.vision:
            return {}
        return {key: torch.cat([part[key] for part in self.vision]) for key in self.vision[0]}


class MultiTurnStage:
    """Episodes in the configured environment, turn by turn on the workers' engines (see the module docstring)."""

    def __init__(self, config: PPOConfig, workers: Any, tokenizer: Any, processor: Any, model_config: Any) -> None:
        self.config, self.env, self.workers, self.tokenizer = config, config.env, workers, tokenizer
        has_images = processor is not None and getattr(processor, "image_processor", None) is not None
        bounds = None
        if has_images:
            frames = family_of(model_config).pixel_bounds_frames
            bounds = vision_bounds(processor, config.data.min_pixels, config.data.max_pixels, frames=frames)
        chat_template = None
        if config.data.override_chat_template:
            from easyr1.data.prompt import load_chat_template

            chat_template = load_chat_template(config.data.override_chat_template)
        self.encoder = TurnEncoder(tokenizer, processor if has_images else None, bounds, chat_template)
        self.mrope = MRopeSettings.from_model_config(model_config) if is_mrope_config(model_config) else None
        self.pad_token_id = pad_token_id(tokenizer)
        # what the engine reads of an observation's images: the images (vLLM) or the processed tensors (HF)
        self.engine_reads_images = engine_traits(config.worker.rollout.name).reads_images
        self.full_context = config.env.context == "full"
        self.rows_per_sample = config.env.rows_per_episode
        self.samples_generated = 0

    # -------------------------------------------------------------------------------------------- the interface
    def collect(self, prompts: Batch, step: int) -> ScoredSamples:
        """``worker.rollout.n`` episodes per seed of ``prompts``, played to the end and scored by the environment."""
        n = self.config.worker.rollout.n
        seeds = [int(seed) for seed in prompts["env_seed"] for _ in range(n)]
        uids = [f"{step}-{group}" for group in range(len(prompts)) for _ in range(n)]
        timings: dict[str, float] = {}
        with timed(timings, "gen"):
            episodes = self.play(seeds, uids, step, round_offset=0, sampling=self.sampling())
        batch = self.assemble(episodes) if self.full_context else self.assemble_turn_rows(episodes)
        # a row's score: its episode's return, or (one row per turn) its turn's reward; success etc. are env/ metrics
        scores = batch["token_level_scores"].sum(dim=-1)
        rewards = Rewards({"overall": scores.tolist()})
        return ScoredSamples(batch, PendingRewards(rewards), episode_metrics(episodes, "env"), timings)

    def sampling(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """This run's sampling settings for one turn (``env.max_tokens_per_turn`` new tokens), with overrides."""
        return sampling_settings(self.config, {"max_tokens": self.env.max_tokens_per_turn, **(overrides or {})})

    def validate(self, step: int) -> Validation:
        """One episode per validation seed (``env.val_seed`` ...), played with ``worker.rollout.val_override_config``'s
        sampling settings; ``val/`` metrics."""
        _, overrides = validation_overrides(self.config)
        seeds = [self.env.val_seed + k for k in range(self.env.val_episodes)]
        uids = [f"val-{seed}" for seed in seeds]
        episodes = self.play(seeds, uids, step, VALIDATION_ROUND, self.sampling(overrides))
        metrics = episode_metrics(episodes, "val")
        metrics["val/reward_score"] = metrics["val/return"]
        return Validation(metrics)

    # --------------------------------------------------------------------------------------------- the episodes
    def play(
        self, seeds: list[int], uids: list[str], step: int, round_offset: int, sampling: dict[str, Any]
    ) -> list[Episode]:
        """Play one episode per seed to its end; turn ``k`` of every live episode is generated in one call."""
        budget = self.config.data.max_response_length
        per_turn = sampling["max_tokens"]
        control = f"{self.config.worker.rollout.seed}-{step}-{round_offset}"  # the image swaps' seed (a control run)
        environments: list[Environment] = []
        try:
            for _ in seeds:
                environments.append(build_environment(self.env.name, self.env.env_class, dict(self.env.env_kwargs)))
            firsts = [self._reset(env, seed) for env, seed in zip(environments, seeds)]
            firsts = self._swap_images(firsts, f"{control}-reset")
            episodes = [
                self._start(env, seed, uid, observation)
                for env, seed, uid, observation in zip(environments, seeds, uids, firsts)
            ]
            position = {id(episode): index for index, episode in enumerate(episodes)}  # each one's sampling seed
            for turn in range(self.env.max_turns):
                live = [e for e in episodes if not e.done]
                for episode in live:  # another full turn must fit the response budget
                    if self.full_context and episode.response_length + per_turn > budget:
                        episode.done = episode.truncated = True
                live = [e for e in live if not e.done]
                if not live:
                    break
                first_seed = round_first_seed(self.config.worker.rollout.seed, step, round_offset + turn, len(seeds))
                row_seeds = [first_seed + position[id(e)] for e in live]
                outputs = self._generate(live, row_seeds, sampling)
                stepped = [self._play_turn(episode, outputs, row, turn) for row, episode in enumerate(live)]
                going_on = [(episode, obs) for episode, obs in zip(live, stepped) if obs is not None]
                observations = self._swap_images([obs for _, obs in going_on], f"{control}-{turn}")
                for (episode, _), observation in zip(going_on, observations):
                    self._add_observation(episode, observation, turn, budget, per_turn)
        finally:
            self._sleep_engines()
            for env in environments:
                env.close()
        return episodes

    def _reset(self, env: Environment, seed: int) -> Observation:
        where = self._where(seed, 0)
        observation = self._call(env.reset, where, seed)
        self._check_observation(observation, where)
        return observation

    def _start(self, env: Environment, seed: int, uid: str, observation: Observation) -> Episode:
        """The episode with its first piece: the system prompt and the first observation."""
        where = self._where(seed, 0)
        system_prompt = self._call(env.system_prompt, where)
        if not isinstance(system_prompt, str):
            raise EnvError(f"{where}: system_prompt() returned {type(system_prompt).__name__}, not a str")
        piece = self._window(system_prompt, observation, where)
        vision = [piece.vision] if piece.vision else []
        raw_ids, ids = list(piece.raw_ids), list(piece.ids)
        episode = Episode(seed, uid, env, raw_ids, ids, len(ids), len(raw_ids), list(piece.images), vision)
        episode.system_prompt, episode.windows = system_prompt, [piece]
        episode.last_observation_images = len(piece.images)
        return episode

    def _window(self, system_prompt: str, observation: Observation, where: str) -> Piece:
        """The system prompt and an observation as a prompt: an episode's first, and with ``env.context=latest``
        every turn's."""
        piece = self.encoder.first(system_prompt, observation, where)
        if len(piece.ids) > self.config.data.max_prompt_length:
            raise EnvError(
                f"{where}: the system prompt and the observation are {len(piece.ids)} tokens, longer than "
                f"data.max_prompt_length={self.config.data.max_prompt_length}; raise it or shorten the observation"
            )
        return piece

    def _context(self, episode: Episode) -> Piece:
        """What the episode's next turn is generated from: its whole trajectory so far, or (``env.context=latest``)
        the system prompt and its latest observation."""
        if not self.full_context:
            return episode.windows[-1]
        return Piece(episode.raw_ids, episode.ids, episode.images, episode.merged_vision())

    def _play_turn(self, episode: Episode, outputs: Batch, row: int, turn: int) -> Observation | None:
        """Append the model's turn and step the environment with its text; returns the next observation, or None
        when the episode ended (done, or its last turn)."""
        mask = outputs["response_mask"][row].bool()
        response = outputs["responses"][row][mask].tolist()
        log_probs = outputs["rollout_log_probs"][row][mask].tolist()
        episode.responses.append(response)
        episode.response_log_probs.append(log_probs)
        if self.full_context:
            episode.raw_ids += response
            episode.ids += response
            episode.loss_mask += [1] * len(response)
            episode.log_probs += log_probs
            episode.turn_ids += [turn] * len(response)
        text = self.tokenizer.decode(response, skip_special_tokens=True)
        where = self._where(episode.seed, turn)
        result = self._call(episode.env.step, where, text)
        observation, reward, done, info = self._check_step(result, where)
        valid = bool(info.get("action_valid", True))
        if not valid:
            reward += self.env.format_penalty
        episode.success = episode.success or bool(info.get("success", False))
        episode.turns.append(
            Turn(text, info.get("action"), reward, valid, len(response), episode.last_observation_images)
        )
        if done or turn + 1 == self.env.max_turns:
            episode.done = True
            return None
        return observation

    def _add_observation(
        self, episode: Episode, observation: Observation, turn: int, budget: int, per_turn: int
    ) -> None:
        """Append the observation after a turn, or end the episode if it and another turn would not fit; with
        ``env.context=latest``, make it the next turn's prompt instead."""
        where = self._where(episode.seed, turn)
        if not self.full_context:
            episode.windows.append(self._window(episode.system_prompt, observation, where))
            episode.last_observation_images = len(observation.images)
            return
        response = episode.responses[-1]
        ended_with_eos = bool(response) and response[-1] == self.encoder.eos_token_id
        piece = self.encoder.next(observation, ended_with_eos, where)
        if episode.response_length + len(piece.ids) + per_turn > budget:
            episode.done = episode.truncated = True
            return
        episode.append(piece)

    def _swap_images(self, observations: list[Observation], key: str) -> list[Observation]:
        """With ``env.shuffle_images`` (a control run), every observation gets the images of another episode's
        observation with as many images, drawn from a seeded shuffle; else the observations as they are."""
        if not self.env.shuffle_images:
            return observations
        rng = random.Random(key)
        swapped = list(observations)
        by_count: dict[int, list[int]] = defaultdict(list)
        for index, observation in enumerate(observations):
            by_count[len(observation.images)].append(index)
        for count, indices in by_count.items():
            donors = list(indices)
            rng.shuffle(donors)
            for index, donor in zip(indices, donors):
                if count:
                    swapped[index] = Observation(observations[index].text, observations[donor].images)
        return swapped

    def _generate(self, live: list[Episode], row_seeds: list[int], sampling: dict[str, Any]) -> Batch:
        """One turn for every live episode on the workers (the group pads the rows to a multiple of the workers)."""
        batch = self._turn_prompts(live)
        batch["sample_seed"] = torch.tensor(row_seeds, dtype=torch.long)
        # the engines stay awake between turns (on GPU a sleep would discard the weights, and each turn resync them)
        return self.workers.run_split(HybridWorker.generate, batch, sampling, stay_awake=True, pad=True)

    def _sleep_engines(self) -> None:
        self.workers.run_all(HybridWorker.sleep_engine)

    def _turn_prompts(self, live: list[Episode]) -> Batch:
        """The live episodes' contexts (see :meth:`_context`) as prompts, left-padded to the longest."""
        contexts = [self._context(episode) for episode in live]
        length = max(len(context.ids) for context in contexts)
        input_ids = torch.full((len(live), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(live), length), dtype=torch.long)
        for row, context in enumerate(contexts):
            input_ids[row, length - len(context.ids) :] = torch.tensor(context.ids)
            attention_mask[row, length - len(context.ids) :] = 1
        vision = [context.vision for context in contexts]
        positions = torch.stack(
            [self._positions(input_ids[row], attention_mask[row], vision[row]) for row in range(len(live))]
        )
        non_tensors: dict[str, Any] = {
            "raw_prompt_ids": [list(context.raw_ids) for context in contexts],
            "multi_modal_data": [{"images": list(context.images)} if context.images else {} for context in contexts],
        }
        if not self.engine_reads_images:
            non_tensors["multi_modal_inputs"] = vision
        return Batch(
            tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions},
            non_tensors=non_tensors,
        )

    def _positions(self, ids: torch.Tensor, mask: torch.Tensor, vision: dict[str, torch.Tensor]) -> torch.Tensor:
        return prompt_position_ids(ids, mask, self.mrope, image_grid_thw=vision.get("image_grid_thw"))

    # -------------------------------------------------------------------------------------- the training batch
    def assemble(self, episodes: list[Episode]) -> Batch:
        """The finished episodes as one training batch (see the module docstring for its fields)."""
        prompt_length, response_length = self.config.data.max_prompt_length, self.config.data.max_response_length
        size = len(episodes)
        prompts = torch.full((size, prompt_length), self.pad_token_id, dtype=torch.long)
        responses = torch.full((size, response_length), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((size, prompt_length), dtype=torch.long)
        response_valid = torch.zeros((size, response_length), dtype=torch.long)
        response_mask = torch.zeros((size, response_length), dtype=torch.long)
        rollout_log_probs = torch.zeros((size, response_length), dtype=torch.float32)
        turn_ids = torch.full((size, response_length), -1, dtype=torch.long)
        for row, episode in enumerate(episodes):
            first, rest = episode.ids[: episode.prompt_length], episode.ids[episode.prompt_length :]
            prompts[row, prompt_length - len(first) :] = torch.tensor(first)
            prompt_mask[row, prompt_length - len(first) :] = 1
            responses[row, : len(rest)] = torch.tensor(rest, dtype=torch.long)
            response_valid[row, : len(rest)] = 1
            response_mask[row, : len(rest)] = torch.tensor(episode.loss_mask, dtype=torch.long)
            rollout_log_probs[row, : len(rest)] = torch.tensor(episode.log_probs, dtype=torch.float32)
            turn_ids[row, : len(rest)] = torch.tensor(episode.turn_ids, dtype=torch.long)
        turn_rewards = [[turn.reward for turn in episode.turns] for episode in episodes]
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "rollout_log_probs": rollout_log_probs,
            "turn_ids": turn_ids,
            "token_level_scores": place_turn_rewards(turn_rewards, turn_ids),
        }
        non_tensors = {
            "uid": [episode.uid for episode in episodes],
            "raw_prompt_ids": [episode.raw_ids[: episode.raw_prompt_length] for episode in episodes],
            "multi_modal_data": [{"images": e.images} if e.images else {} for e in episodes],
            "ground_truth": [f"seed {episode.seed}" for episode in episodes],
            "episode": [episode_record(episode) for episode in episodes],
        }
        vision = [episode.merged_vision() for episode in episodes]
        return self._training_batch(tensors, prompt_mask, response_valid, vision, non_tensors)

    def _training_batch(
        self,
        tensors: dict[str, torch.Tensor],
        prompt_mask: torch.Tensor,
        response_valid: torch.Tensor,
        vision: list[dict[str, torch.Tensor]],
        non_tensors: dict[str, list[Any]],
    ) -> Batch:
        """Assembled rows as a training batch: ``tensors`` (prompts, responses, ...) with the whole sequences, their
        attention mask (``prompt_mask`` then ``response_valid``), positions over each row's ``vision`` and new
        sample ids; ``non_tensors`` (one value per row) with the vision tensors as ``multi_modal_inputs``."""
        size = len(vision)
        input_ids = torch.cat([tensors["prompts"], tensors["responses"]], dim=-1)
        attention_mask = torch.cat([prompt_mask, response_valid], dim=-1)
        position_ids = torch.stack(
            [self._positions(input_ids[row], attention_mask[row], vision[row]) for row in range(size)]
        )
        sample_ids = torch.arange(size) + self.samples_generated
        self.samples_generated += size
        return Batch(
            tensors={
                **tensors,
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "position_ids": position_ids,
                "sample_id": sample_ids,
            },
            non_tensors={**non_tensors, "multi_modal_inputs": vision},
        )

    def assemble_turn_rows(self, episodes: list[Episode]) -> Batch:
        """``env.context=latest``: every turn of every episode as its own row, ``env.max_turns`` rows per episode.

        Row ``e * max_turns + k`` is turn ``k`` of episode ``e``: the prompt is the system prompt and the observation
        that turn saw, the response the model's tokens (all trained on), ``token_level_scores`` the turn's reward on
        its last token. Turns an episode did not play are padding rows (one prompt token, no response token, no
        reward) that keep the row count fixed, so batches split evenly over workers and mini-batches; nothing in
        them reaches a loss or a metric. ``episode_index`` gives every row its episode: the advantage is computed
        once per episode (:func:`easyr1.algorithms.episode_advantages`) and shared by its rows. The first row of an
        episode carries its report record (``episode``) and the images of all its turns (``episode_images``).
        """
        prompt_length, response_length = self.config.data.max_prompt_length, self.config.data.max_response_length
        size = len(episodes) * self.rows_per_sample
        prompts = torch.full((size, prompt_length), self.pad_token_id, dtype=torch.long)
        responses = torch.full((size, response_length), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((size, prompt_length), dtype=torch.long)
        response_mask = torch.zeros((size, response_length), dtype=torch.long)
        rollout_log_probs = torch.zeros((size, response_length), dtype=torch.float32)
        turn_ids = torch.full((size, response_length), -1, dtype=torch.long)
        token_level_scores = torch.zeros((size, response_length), dtype=torch.float32)
        episode_index = torch.arange(len(episodes)).repeat_interleave(self.rows_per_sample)
        pad_piece = Piece([self.pad_token_id], [self.pad_token_id])
        pieces: list[Piece] = []
        records: list[dict[str, Any] | None] = []
        episode_images: list[list[Image.Image] | None] = []
        for index, episode in enumerate(episodes):
            for turn in range(self.rows_per_sample):
                row = index * self.rows_per_sample + turn
                first_row = turn == 0
                records.append(episode_record(episode) if first_row else None)
                episode_images.append([image for w in episode.windows for image in w.images] if first_row else None)
                piece = episode.windows[turn] if turn < len(episode.turns) else pad_piece
                pieces.append(piece)
                prompts[row, prompt_length - len(piece.ids) :] = torch.tensor(piece.ids)
                prompt_mask[row, prompt_length - len(piece.ids) :] = 1
                if piece is pad_piece:
                    continue
                response = episode.responses[turn]
                responses[row, : len(response)] = torch.tensor(response, dtype=torch.long)
                response_mask[row, : len(response)] = 1
                rollout_log_probs[row, : len(response)] = torch.tensor(episode.response_log_probs[turn])
                turn_ids[row, : len(response)] = turn
                token_level_scores[row, max(len(response) - 1, 0)] = episode.turns[turn].reward
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "rollout_log_probs": rollout_log_probs,
            "turn_ids": turn_ids,
            "token_level_scores": token_level_scores,
            "episode_index": episode_index,
        }
        episode_of_row = [episodes[int(index)] for index in episode_index]
        non_tensors = {
            "uid": [episode.uid for episode in episode_of_row],
            "raw_prompt_ids": [list(piece.raw_ids) for piece in pieces],
            "multi_modal_data": [{"images": piece.images} if piece.images else {} for piece in pieces],
            "ground_truth": [f"seed {episode.seed}" for episode in episode_of_row],
            "episode": records,
            "episode_images": episode_images,
        }
        vision = [piece.vision for piece in pieces]
        return self._training_batch(tensors, prompt_mask, response_mask, vision, non_tensors)

    # ------------------------------------------------------------------------------------------------- checks
    def _where(self, seed: int, turn: int) -> str:
        name = self.env.name or self.env.env_class
        return f"environment {name}, episode seed {seed}, turn {turn}"

    def _call(self, method: Any, where: str, *args: Any) -> Any:
        """Run an environment method; an exception or a hang stops the run naming the episode and turn."""
        try:
            return call_with_time_limit(method, args, STEP_TIMEOUT_SECONDS)
        except CallTimedOut:
            raise EnvError(
                f"{where}: {method.__name__}() did not return within {STEP_TIMEOUT_SECONDS:.0f} s; the environment "
                "hangs"
            ) from None
        except EnvError:
            raise
        except Exception as error:
            raise EnvError(f"{where}: {method.__name__}() raised {type(error).__name__}: {error}") from error

    def _check_observation(self, observation: Any, where: str) -> None:
        if not isinstance(observation, Observation):
            raise EnvError(
                f"{where}: the environment returned {type(observation).__name__} as its observation; return "
                "easyr1.envs.Observation(text, images)"
            )
        if not isinstance(observation.text, str) or not all(isinstance(i, Image.Image) for i in observation.images):
            raise EnvError(f"{where}: an observation's text must be a str and its images PIL images")
        markers = observation.text.count(IMAGE_MARKER)
        if markers not in (0, len(observation.images)):
            raise EnvError(
                f"{where}: the observation's text has {markers} <image> marker(s) but {len(observation.images)} "
                "image(s); use one marker per image (or none: the images then go before the text)"
            )

    def _check_step(self, result: Any, where: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if not (isinstance(result, tuple) and len(result) == 4):
            raise EnvError(f"{where}: step() must return (observation, reward, done, info), got {result!r:.200}")
        observation, reward, done, info = result
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EnvError(f"{where}: step() returned the reward {reward!r}; it must be a finite number")
        if not isinstance(info, dict):
            raise EnvError(f"{where}: step() returned info of type {type(info).__name__}; it must be a dict")
        if not done:
            self._check_observation(observation, where)
        return observation, float(reward), bool(done), info


def episode_record(episode: Episode) -> dict[str, Any]:
    """What the report shows of an episode: its seed, outcome and turns."""
    return {
        "seed": episode.seed,
        "success": episode.success,
        "truncated": episode.truncated,
        "turns": [vars(turn).copy() for turn in episode.turns],
    }


def episode_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    """Success rate, return, turns, invalid-action rate, tokens per turn and truncations of finished episodes."""
    turns = [turn for episode in episodes for turn in episode.turns]
    returns = [sum(turn.reward for turn in episode.turns) for episode in episodes]
    return {
        f"{prefix}/success_rate": float(np.mean([episode.success for episode in episodes])),
        f"{prefix}/return": float(np.mean(returns)),
        f"{prefix}/turns": float(np.mean([len(episode.turns) for episode in episodes])),
        f"{prefix}/invalid_action_rate": float(np.mean([not turn.action_valid for turn in turns])) if turns else 0.0,
        f"{prefix}/tokens_per_turn": float(np.mean([turn.tokens for turn in turns])) if turns else 0.0,
        f"{prefix}/truncated_rate": float(np.mean([episode.truncated for episode in episodes])),
    }
