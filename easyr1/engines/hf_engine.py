"""The Hugging Face engine: responses sampled with ``transformers`` ``generate`` (``worker.rollout.name=hf``).

It keeps its own unsharded copy of the model on each worker, like vLLM does, so that ranks can stop
generating at different lengths without waiting for each other; the actor's weights are copied in by
:meth:`HFEngine.sync_weights`. A prompt's samples share one ``generate``, different prompts do not (no padding, and
no cache larger than one prompt's samples need), so it is slower than vLLM (bench/README.md, the peer benchmark);
it serves where vLLM is not installed or does not run the model.
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
from easyr1.protocol import Batch, merge_vision_inputs, same_vision_inputs


# the tensors that make a row's prompt: rows equal in all of them (and in vision inputs and partial response) are one
# generate's rows
INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")


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
    ) -> None:
        self.device = device
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
        are batched. Rows with the same inputs (a prompt's samples, side by side as the driver repeats them) share
        one ``generate``; :class:`~easyr1.engines.seeded_sampling.SeededSampler` draws each row's tokens.

        With ``stop``, every row is generated to its end first and then cut where a lockstep decoder would have
        stopped (:func:`~easyr1.engines.base.stop_position`): the tokens past that point are discarded, so a row's
        kept tokens are those it would have had, at the cost of decoding the discarded ones (this engine serves
        debugging and CPU runs; vLLM stops for real).
        """
        response_ids: list[list[int]] = [[] for _ in range(len(prompts))]
        response_log_probs: list[list[float]] = [[] for _ in range(len(prompts))]
        ended = [False] * len(prompts)
        groups = self.input_groups(prompts)
        for first, count in tqdm(groups, desc="generate", leave=False, disable=not self.show_progress):
            rows = range(first, first + count)
            for row, ids, log_probs, row_ended in zip(
                rows, *self._generate_group(prompts, first, count, sampling, seeds[first : first + count])
            ):
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
    def input_groups(prompts: Batch) -> list[tuple[int, int]]:
        """Runs of consecutive rows with the same inputs, as (first row, rows): the same prompt tokens, positions,
        partial response and vision inputs (the same objects, or equal tensors), all to be generated. Each run is
        one ``generate`` of as many rows."""
        vision = prompts["multi_modal_inputs"] if "multi_modal_inputs" in prompts else None
        groups: list[tuple[int, int]] = []
        for row in range(len(prompts)):
            if groups and is_active(prompts, row) and is_active(prompts, groups[-1][0]):
                first, count = groups[-1]
                if (
                    all(torch.equal(prompts[key][row], prompts[key][first]) for key in INPUT_KEYS)
                    and partial_of(prompts, row)[0] == partial_of(prompts, first)[0]
                    and (vision is None or same_vision_inputs(vision[row], vision[first]))
                ):
                    groups[-1] = (first, count + 1)
                    continue
            groups.append((row, 1))
        return groups

    def _generate_group(
        self, prompts: Batch, first: int, count: int, sampling: SamplingSettings, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """The new tokens, their log-probs, and whether each ended (EOS, or its token budget used), for the
        ``count`` rows from ``first``, whose inputs are the same."""
        partial_ids, _ = partial_of(prompts, first)
        budget = sampling.max_tokens - len(partial_ids)
        if not is_active(prompts, first) or budget <= 0:
            return [[]] * count, [[]] * count, [budget <= 0] * count
        prompt = prompts.index([first])
        mask = prompt["attention_mask"][0].bool()
        input_ids = prompt["input_ids"][:, mask]
        # The dataset's positions, which the actor scores with: left to itself, transformers' generate would place
        # the vision tokens by its own rule (5.19's Qwen-VL models need mm_token_type_ids for m-rope, which the
        # prompts do not carry, and give plain text positions without them). Each new token continues after the
        # last position in every row, as extend_position_ids does after a prompt that ends in text.
        positions = prompt["position_ids"][..., mask]
        if partial_ids:  # the partial response becomes part of the prompt; the model sees one sequence
            input_ids = torch.cat([input_ids, torch.tensor([partial_ids], dtype=input_ids.dtype)], dim=-1)
            positions = extend_position_ids(positions, len(partial_ids))
        if positions.dim() == 3:  # (1, 4, L) -> (4, rows, L), the layout the model's forward takes (as the actor's)
            positions = positions.transpose(0, 1).expand(-1, count, -1)
        else:
            positions = positions.expand(count, -1)
        input_ids = input_ids.expand(count, -1).to(self.device)
        # each row's own copy of the vision inputs, as a batch of count rows carries them
        vision = {}
        if "multi_modal_inputs" in prompt:
            vision = merge_vision_inputs(list(prompt["multi_modal_inputs"]) * count)
        # the prompt's token types (Gemma 3's bidirectional image blocks), as the trainer's forward computes them
        vision.update(family_of(self.model.config).token_type_inputs(input_ids, self.model.config))
        sampler = SeededSampler(seeds, sampling)
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            position_ids=positions.contiguous().to(self.device),
            **{key: value.to(self.device) for key, value in vision.items()},
            do_sample=False,  # the sampler chooses every token; generate takes the one it leaves
            logits_processor=LogitsProcessorList([sampler]),
            max_new_tokens=budget,
            eos_token_id=None if sampling.ignore_eos else self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            sequence_bias=self.sequence_bias,
            return_dict_in_generate=True,
        )
        all_ids, all_log_probs, ended = [], [], []
        for row in range(count):
            new_ids = output.sequences[row, input_ids.shape[1] :].tolist()
            log_probs = sampler.log_probs(row)
            # generate pads a row after its EOS while others go on; keep the response up to and including its EOS
            end = next(
                (i for i, token in enumerate(new_ids) if token in self.eos_token_ids and not sampling.ignore_eos), None
            )
            if end is not None:
                new_ids, log_probs, row_ended = new_ids[: end + 1], log_probs[: end + 1], True
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
    )
