"""Observations as tokens: the chat-formatted pieces a multi-turn trajectory grows by, in the two forms it needs.

A trajectory is one sequence. Its first piece is the system prompt and the first observation, ending with the
assistant's generation prompt; after each model turn comes the end of the assistant's message and the next
observation as a user message, again ending with the generation prompt. Every piece is tokenised once, on its own,
and kept twice:

- ``raw_ids``: one image placeholder per image, what vLLM receives (it expands the placeholders itself);
- ``ids``: the placeholders expanded to one token per vision token, what the actor trains on; with the processed
  ``vision`` tensors (``pixel_values``, ``image_grid_thw``) of the piece's images.

The model's own tokens are appended to both as generated, never re-tokenised, so the prompt vLLM sees at turn k is
exactly the prefix the actor scores. The pieces come from the chat template itself (the text a two-message
conversation adds over a one-message one), so any template that renders conversations by concatenating messages
works, and a model turn cut off before its end-of-message token gets the template's full closing text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from easyr1.data.prompt import build_messages
from easyr1.data.vision import VisionBounds, resize_image
from easyr1.envs.base import Observation


# Stand-ins used only to cut the template's fixed text around messages; they never reach the model.
_SYSTEM_PROBE = "SYSTEM-PROBE"
_USER_PROBE = "USER-PROBE"
_ASSISTANT_PROBE = "ASSISTANT-PROBE"


@dataclass
class Piece:
    """A tokenised part of a trajectory: unexpanded and expanded ids, its resized images and their vision tensors."""

    raw_ids: list[int]
    ids: list[int]
    images: list[Image.Image] = field(default_factory=list)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)


class TurnEncoder:
    """Tokenises the pieces of a trajectory with the run's tokenizer, processor and chat template."""

    def __init__(
        self,
        tokenizer: Any,
        processor: Any | None,
        bounds: VisionBounds | None,
        chat_template: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.processor = processor
        self.bounds = bounds
        self.chat_template = chat_template
        self.eos_token_id = tokenizer.eos_token_id
        # The text that closes an assistant message (for Qwen "<|im_end|>\n"), and what is left of it when the model
        # generated the end-of-message token itself.
        with_answer = self._render(
            [
                {"role": "system", "content": _SYSTEM_PROBE},
                {"role": "user", "content": _USER_PROBE},
                {"role": "assistant", "content": _ASSISTANT_PROBE},
            ],
            generation_prompt=False,
        )
        self.assistant_close = with_answer[with_answer.index(_ASSISTANT_PROBE) + len(_ASSISTANT_PROBE) :]
        eos_text = tokenizer.decode([self.eos_token_id]) if self.eos_token_id is not None else ""
        self.after_eos = (
            self.assistant_close[len(eos_text) :]
            if eos_text and self.assistant_close.startswith(eos_text)
            else self.assistant_close
        )

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        owner = self.processor if self.processor is not None else self.tokenizer
        return owner.apply_chat_template(
            messages, chat_template=self.chat_template, add_generation_prompt=generation_prompt, tokenize=False
        )

    def _user_message(self, observation: Observation, where: str) -> dict[str, Any]:
        return build_messages(observation.text, len(observation.images), 0, where)[0]

    def first(self, system_prompt: str, observation: Observation, where: str) -> Piece:
        """The trajectory's first piece: system prompt, first observation, generation prompt."""
        messages = [{"role": "system", "content": system_prompt}, self._user_message(observation, where)]
        return self._encode(self._render(messages, generation_prompt=True), observation.images)

    def next(self, observation: Observation, ended_with_eos: bool, where: str) -> Piece:
        """The piece after a model turn: the close of the model's message, the observation, the generation prompt.

        ``ended_with_eos``: the turn's last token was the end-of-message token (else the turn was cut off at the
        token limit and the whole closing text is added)."""
        system = {"role": "system", "content": _SYSTEM_PROBE}
        before = self._render([system], generation_prompt=False)
        after = self._render([system, self._user_message(observation, where)], generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template does not render a conversation as its messages one after the other; multi-turn "
                "trajectories cannot be cut into pieces with it (set data.override_chat_template)"
            )
        close = self.after_eos if ended_with_eos else self.assistant_close
        return self._encode(close + after[len(before) :], observation.images)

    def _encode(self, text: str, images: list[Image.Image]) -> Piece:
        raw_ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not images:
            return Piece(raw_ids, list(raw_ids))
        if self.processor is None or self.bounds is None:
            raise ValueError("the observation has images but the model has no image processor (a text-only model)")
        resized = [resize_image(image.convert("RGB"), self.bounds) for image in images]
        outputs = self.processor(text=[text], images=resized, add_special_tokens=False, return_tensors="pt")
        dropped = ("input_ids", "attention_mask", "mm_token_type_ids")
        vision = {key: value for key, value in outputs.items() if key not in dropped}
        return Piece(raw_ids, outputs["input_ids"][0].tolist(), resized, vision)
