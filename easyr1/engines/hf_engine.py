"""The Hugging Face engine: responses sampled with ``transformers`` ``generate`` (``worker.rollout.name=hf``).

It keeps its own unsharded copy of the model on each worker, like vLLM does, so that ranks can stop
generating at different lengths without waiting for each other; the actor's weights are copied in by
:meth:`HFEngine.sync_weights`. Slower than vLLM on GPU, about as fast on CPU at tiny sizes, and
useful where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from tqdm import tqdm

from easyr1.algorithms.logits import BANNED_TOKEN_BIAS
from easyr1.engines.base import SamplingSettings, StopRule, is_active, pack_continued, partial_of, stop_position
from easyr1.engines.registry import EngineSetup, EngineTraits, register_engine
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
    ) -> None:
        self.device = device
        self.weights_discarded = False  # the private copy is never dropped, so it needs a sync only after updates
        # the actor's architecture settings (model.override_config), so the copy computes what the actor computes
        from easyr1.models.loading import load_model

        self.model = load_model(model_path, dtype, override_config=override_config).to(device).eval()
        self.show_progress = show_progress
        self.pad_token_id = pad_token_id
        self.eos_token_ids = eos_token_ids
        self.sequence_bias = {(token,): BANNED_TOKEN_BIAS for token in banned_token_ids} or None

    @torch.no_grad()
    def generate(
        self, prompts: Batch, sampling: SamplingSettings, seeds: list[int], stop: StopRule | None = None
    ) -> Batch:
        """Generate row by row so that each row's sampling depends only on its own seed.

        With ``stop``, every row is generated to its end first and then cut where a lockstep decoder would have
        stopped (:func:`~easyr1.engines.base.stop_position`): the tokens past that point are discarded, so a row's
        kept tokens are those it would have had, at the cost of decoding the discarded ones (this engine serves
        debugging and CPU runs; vLLM stops for real).
        """
        response_ids, response_log_probs, ended = [], [], []
        for row in tqdm(range(len(prompts)), desc="generate", leave=False, disable=not self.show_progress):
            ids, log_probs, row_ended = self._generate_one(prompts, row, sampling, seeds[row])
            response_ids.append(ids)
            response_log_probs.append(log_probs)
            ended.append(row_ended)
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

    def _generate_one(
        self, prompts: Batch, row: int, sampling: SamplingSettings, seed: int
    ) -> tuple[list[int], list[float], bool]:
        """Row ``row``'s new tokens, their log-probs, and whether it ended (EOS, or its token budget used)."""
        partial_ids, _ = partial_of(prompts, row)
        budget = sampling.max_tokens - len(partial_ids)
        if not is_active(prompts, row) or budget <= 0:
            return [], [], budget <= 0
        prompt = prompts.index([row])
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
        if positions.dim() == 3:  # (1, 4, L) -> (4, 1, L), the layout the model's forward takes (as the actor's)
            positions = positions.transpose(0, 1).contiguous()
        input_ids = input_ids.to(self.device)
        vision = merge_vision_inputs(prompt["multi_modal_inputs"]) if "multi_modal_inputs" in prompt else {}
        # the prompt's token types (Gemma 3's bidirectional image blocks), as the trainer's forward computes them
        vision.update(family_of(self.model.config).token_type_inputs(input_ids, self.model.config))
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                position_ids=positions.to(self.device),
                **{key: value.to(self.device) for key, value in vision.items()},
                do_sample=not sampling.greedy,
                temperature=sampling.temperature if not sampling.greedy else None,
                top_p=sampling.top_p if not sampling.greedy else None,
                top_k=(sampling.top_k if sampling.top_k > 0 else None) if not sampling.greedy else None,
                max_new_tokens=budget,
                eos_token_id=None if sampling.ignore_eos else self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                sequence_bias=self.sequence_bias,
                output_scores=True,
                return_dict_in_generate=True,
            )
        finally:
            torch.random.set_rng_state(generator_state)
        new_ids = output.sequences[0, input_ids.shape[1] :].tolist()
        log_probs = []
        for step, token in enumerate(new_ids):
            log_probs.append(torch.log_softmax(output.scores[step][0].float(), dim=-1)[token].item())
        # generate pads after EOS; keep the response up to and including the first EOS
        for end, token in enumerate(new_ids):
            if token in self.eos_token_ids and not sampling.ignore_eos:
                return new_ids[: end + 1], log_probs[: end + 1], True
        return new_ids, log_probs, len(new_ids) >= budget

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
