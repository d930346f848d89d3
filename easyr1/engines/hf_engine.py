"""The Hugging Face engine: responses sampled with ``transformers`` ``generate`` (``worker.rollout.name=hf``).

It keeps its own unsharded copy of the model on each worker, like vLLM does, so that ranks can stop
generating at different lengths without waiting for each other; the actor's weights are copied in by
:meth:`HFEngine.sync_weights`. Rows are generated in batches of
``worker.actor.micro_batch_size_per_device_for_experience`` (the rows a log-prob forward takes at once, so the user's
bound on one pass's memory), left-padded to the longest. Slower than vLLM on GPU; it serves where vLLM is not
installed or does not run the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LogitsProcessorList

from easyr1.algorithms.logits import BANNED_TOKEN_BIAS
from easyr1.engines.base import SamplingSettings, StopRule, is_active, pack_continued, partial_of, stop_position
from easyr1.engines.registry import EngineSetup, EngineTraits, register_engine
from easyr1.engines.seeded_sampling import SeededSampler
from easyr1.models.families import family_of
from easyr1.models.rope import extend_position_ids
from easyr1.protocol import Batch, merge_vision_inputs


class HFEngine:
    """Sample responses with ``model.generate`` on a private copy of the policy."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: torch.dtype,
        pad_token_id: int,
        eos_token_ids: list[int],
        banned_token_ids: list[int],
        device: str,
        override_config: dict[str, Any] | None = None,
        show_progress: bool = False,
        rows_per_generate: int = 16,
    ) -> None:
        self.device = device
        self.rows_per_generate = rows_per_generate
        self.weights_discarded = False  # the private copy is never dropped, so it needs a sync only after updates
        # the actor's architecture settings (model.override_config), so the copy computes what the actor computes
        from easyr1.models.loading import load_model

        self.model = load_model(model_path, dtype, override_config=override_config).to(device).eval()
        # The checkpoint's sampling defaults (generation_config.json: a repetition penalty, top-k, ...) are not the
        # rollout's; generate would apply them to whatever it is not told. The engine samples what worker.rollout
        # says and nothing else, as vLLM does with explicit sampling parameters: only the token ids are kept.
        loaded = self.model.generation_config
        self.model.generation_config = GenerationConfig(
            bos_token_id=loaded.bos_token_id, eos_token_id=loaded.eos_token_id, pad_token_id=loaded.pad_token_id
        )
        self.show_progress = show_progress
        self.pad_token_id = pad_token_id
        self.eos_token_ids = eos_token_ids
        self.sequence_bias = {(token,): BANNED_TOKEN_BIAS for token in banned_token_ids} or None

    @torch.no_grad()
    def generate(
        self, prompts: Batch, sampling: SamplingSettings, seeds: list[int], stop: StopRule | None = None
    ) -> Batch:
        """Sample each row from its own seed: a row's tokens depend on its inputs and seed only, however the rows
        are batched. Up to ``rows_per_generate`` rows at a time share one ``generate``, left-padded to the longest;
        :class:`~easyr1.engines.seeded_sampling.SeededSampler` draws each row's tokens.

        With ``stop``, every row is generated to its end first and then cut where a lockstep decoder would have
        stopped (:func:`~easyr1.engines.base.stop_position`): the tokens past that point are discarded, so a row's
        kept tokens are those it would have had, at the cost of decoding the discarded ones (this engine serves
        debugging and CPU runs; vLLM stops for real).
        """
        response_ids: list[list[int]] = [[] for _ in range(len(prompts))]
        response_log_probs: list[list[float]] = [[] for _ in range(len(prompts))]
        ended = [False] * len(prompts)
        budgets = [sampling.max_tokens - len(partial_of(prompts, row)[0]) for row in range(len(prompts))]
        to_generate = []
        for row in range(len(prompts)):
            if is_active(prompts, row) and budgets[row] > 0:
                to_generate.append(row)
            else:
                ended[row] = budgets[row] <= 0
        size = self.rows_per_generate
        batches = [to_generate[start : start + size] for start in range(0, len(to_generate), size)]
        for rows in tqdm(batches, desc="generate", leave=False, disable=not self.show_progress):
            generated = self._generate_rows(
                prompts, rows, sampling, [seeds[row] for row in rows], [budgets[row] for row in rows]
            )
            for row, ids, log_probs, row_ended in zip(rows, *generated):
                response_ids[row], response_log_probs[row], ended[row] = ids, log_probs, row_ended
        if stop is not None:
            uids = [str(uid) for uid in prompts["uid"]]
            must = prompts["must_finish"].tolist() if "must_finish" in prompts else [False] * len(prompts)
            active = [is_active(prompts, row) for row in range(len(prompts))]
            position = stop_position(
                [len(ids) for ids, live in zip(response_ids, active) if live],
                [done for done, live in zip(ended, active) if live],
                [uid for uid, live in zip(uids, active) if live],
                [flag for flag, live in zip(must, active) if live],
                stop.groups,
            )
            for row, ids in enumerate(response_ids):
                if len(ids) > position:
                    response_ids[row], response_log_probs[row] = ids[:position], response_log_probs[row][:position]
                    ended[row] = False
        return pack_continued(prompts, response_ids, response_log_probs, ended, sampling.max_tokens, self.pad_token_id)

    @staticmethod
    def _row_inputs(prompts: Batch, row: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Row ``row``'s input ids (L,), positions (..., L) and vision inputs: its prompt without padding, then the
        partial response it continues, if any."""
        partial_ids, _ = partial_of(prompts, row)
        mask = prompts["attention_mask"][row].bool()
        input_ids = prompts["input_ids"][row][mask]
        # The dataset's positions, which the actor scores with: left to itself, transformers' generate would place
        # the vision tokens by its own rule (5.19's Qwen-VL models need mm_token_type_ids for m-rope, which the
        # prompts do not carry, and give plain text positions without them). Each new token continues after the
        # last position in every row (generate adds one to each row's last), as extend_position_ids does after a
        # prompt that ends in text.
        positions = prompts["position_ids"][row : row + 1][..., mask]
        if partial_ids:  # the partial response becomes part of the prompt; the model sees one sequence
            input_ids = torch.cat([input_ids, torch.tensor(partial_ids, dtype=input_ids.dtype)])
            positions = extend_position_ids(positions, len(partial_ids))
        vision = prompts["multi_modal_inputs"][row] if "multi_modal_inputs" in prompts else None
        return input_ids, positions[0], vision or {}

    def _generate_rows(
        self, prompts: Batch, rows: list[int], sampling: SamplingSettings, seeds: list[int], budgets: list[int]
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """The new tokens, their log-probs, and whether each ended (EOS, or its token budget used), for ``rows``
        in one ``generate``: left-padded to the longest row, each row cut at its own token budget."""
        inputs = [self._row_inputs(prompts, row) for row in rows]
        length = max(len(ids) for ids, _, _ in inputs)
        count = len(rows)
        input_ids = torch.full((count, length), self.pad_token_id, dtype=inputs[0][0].dtype)
        attention_mask = torch.zeros((count, length), dtype=torch.long)
        positions = torch.zeros((count, *inputs[0][1].shape[:-1], length), dtype=inputs[0][1].dtype)
        for index, (ids, row_positions, _) in enumerate(inputs):
            input_ids[index, length - len(ids) :] = ids
            attention_mask[index, length - len(ids) :] = 1
            positions[index, ..., length - len(ids) :] = row_positions
        if positions.dim() == 3:  # (rows, 4, L) -> (4, rows, L), the layout the model's forward takes (as the actor's)
            positions = positions.transpose(0, 1)
        input_ids = input_ids.to(self.device)
        # the rows' vision inputs in row order, as the model matches them to the vision tokens in order
        vision = merge_vision_inputs([row_vision for _, _, row_vision in inputs])
        # the prompt's token types (Gemma 3's bidirectional image blocks), as the trainer's forward computes them
        vision.update(family_of(self.model.config).token_type_inputs(input_ids, self.model.config))
        sampler = SeededSampler(seeds, sampling)
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask.to(self.device),
            position_ids=positions.contiguous().to(self.device),
            **{key: value.to(self.device) for key, value in vision.items()},
            do_sample=False,  # the sampler chooses every token; generate takes the one it leaves
            logits_processor=LogitsProcessorList([sampler]),
            max_new_tokens=max(budgets),
            eos_token_id=None if sampling.ignore_eos else self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            sequence_bias=self.sequence_bias,
            return_dict_in_generate=True,
        )
        all_ids, all_log_probs, ended = [], [], []
        for index, (budget, log_probs) in enumerate(zip(budgets, sampler.log_probs())):
            new_ids = output.sequences[index, length : length + budget].tolist()
            # generate pads a row after its EOS while others go on; keep the response up to and including its EOS
            end = next(
                (i for i, token in enumerate(new_ids) if token in self.eos_token_ids and not sampling.ignore_eos), None
            )
            if end is not None:
                new_ids, row_ended = new_ids[: end + 1], True
            else:
                row_ended = len(new_ids) >= budget
            all_ids.append(new_ids)
            all_log_probs.append(log_probs[: len(new_ids)])
            ended.append(row_ended)
        return all_ids, all_log_probs, ended

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's full parameters into the private model; every parameter must be covered."""
        own = dict(self.model.named_parameters())
        copied = set()
        for name, tensor in named_tensors:
            own[name].copy_(tensor)
            copied.add(name)
        if copied != set(own):
            raise RuntimeError(f"weight sync missed parameters: {sorted(set(own) - copied)[:5]}")

    def sleep(self) -> None:
        """Nothing to release: the copy stays resident."""

    def wake_weights(self) -> None:
        """Nothing to re-acquire: the weights never leave."""

    def wake_kv_cache(self) -> None:
        """Nothing to re-acquire: ``generate`` allocates its cache per call."""

    def close(self) -> None:
        """Nothing beyond the copy's memory, freed with the engine."""


@register_engine("hf", EngineTraits(reads_images=False, tensor_parallel=False))
def build_hf_engine(setup: EngineSetup) -> HFEngine:
    """``worker.rollout.name=hf``: a private copy of the actor's checkpoint with its ``model.override_config``."""
    model = setup.config.worker.actor.model
    return HFEngine(
        model.model_path,
        dtype=setup.dtype,
        pad_token_id=setup.pad_token_id,
        eos_token_ids=setup.eos_token_ids,
        banned_token_ids=setup.banned_token_ids,
        device=setup.device,
        override_config=model.override_config,
        show_progress=setup.show_progress,
        # as many rows as a log-prob forward takes at once: the user's bound on one pass's memory
        rows_per_generate=setup.config.worker.actor.micro_batch_size_per_device_for_experience,
    )
