"""What the trainer needs to know about a model family, in one record per ``model_type``.

Code that differs between families reads it from the model's :class:`Family` (``family_of(config)``) instead of
assuming Qwen-VL: where the vision tower lives (LoRA's default exclusion, the FSDP root unit, freezing), which
tokens are vision placeholders (never sampled), the dummy image that keeps ranks in step, whether positions are
m-rope, and how the processor's expanded prompt maps back to the engine's unexpanded one. A family module builds
its records and, for the tiny random model of tests and demos, a :class:`TinyRecipe`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar


if TYPE_CHECKING:  # torch is imported where a tensor is made: the config checks read families without it
    import torch
    from torch import nn


T = TypeVar("T")

# The module names under which the families here keep their vision (and audio) encoders and projectors.
QWEN_VISION_MODULES = ("visual",)


@dataclass(frozen=True)
class TinyRecipe:
    """How ``easyr1.tools.tiny_model`` builds a tiny random model of a family.

    ``config(tokenizer, shape)`` returns the transformers config (token ids read from the tiny tokenizer, the
    language model sized by ``shape``: ``tiny_model.TextShape``); ``processor(tokenizer)`` the processor (``None``:
    text-only); ``special_tokens`` are added to the tiny tokenizer after Qwen's (each a single token);
    ``chat_template`` replaces the Qwen one when the family renders images differently; ``model_class``: ``"vlm"``
    (``AutoModelForImageTextToText``) or ``"causal"`` (``AutoModelForCausalLM``). ``named_tokens``: attribute
    names the tokenizer gives some of the special tokens (``("boi_token", "<start_of_image>")``: the processor reads
    ``tokenizer.boi_token``); ``literal_tokens``: ordinary (not special) tokens added whole, for strings a library
    looks up in the vocabulary by their text (byte-level BPE spells them otherwise)."""

    config: Callable[[Any, Any], Any]
    processor: Callable[[Any], Any] | None = None
    special_tokens: tuple[str, ...] = ()
    named_tokens: tuple[tuple[str, str], ...] = ()
    chat_template: str | None = None
    model_class: str = "vlm"
    literal_tokens: tuple[str, ...] = ()


def rename_safetensors(directory: Path, rename: Callable[[str], str]) -> None:
    """Rename the tensors of every ``*.safetensors`` file in ``directory`` (metadata kept) and the weight map of
    ``model.safetensors.index.json``, when there is one."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata()
        tensors = load_file(str(path))
        renamed = {rename(name): tensor for name, tensor in tensors.items()}
        if renamed.keys() != tensors.keys():
            save_file(renamed, str(path), metadata=metadata)
    index = directory / "model.safetensors.index.json"
    if index.exists():
        content = json.loads(index.read_text())
        content["weight_map"] = {rename(name): file for name, file in content["weight_map"].items()}
        index.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def qwen_turns_chat_template(image_text: str, video_text: str) -> str:
    """A tiny model's chat template: Qwen's turns (a default system message; ``<|im_end|>`` ends every message, the
    tiny models' EOS) with an image part rendered as ``image_text`` and a video part as ``video_text``, the way the
    family's own template writes its placeholders (which its processor then expands)."""
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "{% endif %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}"
        "{{ message['content'] }}"
        "{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
        f"{image_text}"
        "{% elif part['type'] == 'video' or 'video' in part %}"
        f"{video_text}"
        "{% elif 'text' in part %}"
        "{{ part['text'] }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "<|im_start|>assistant\n"
        "{% endif %}"
    )


def collapse_placeholder_runs(expanded_ids: Sequence[int], placeholder_id: int | None) -> list[int]:
    """``expanded_ids`` with every run of ``placeholder_id`` collapsed to one: the Qwen-VL processors expand one
    image placeholder into a run of them, and nothing else."""
    return [
        token
        for position, token in enumerate(expanded_ids)
        if not (token == placeholder_id and position > 0 and expanded_ids[position - 1] == placeholder_id)
    ]


def qwen_expansion_matches(expanded_ids: Sequence[int], raw_ids: Sequence[int], processor: Any, config: Any) -> bool:
    """Whether the processor's ids are the raw ids with each image placeholder repeated (the Qwen-VL rule)."""
    placeholder = getattr(processor, "image_token_id", None)
    if placeholder is None:
        placeholder = getattr(config, "image_token_id", None)
    return collapse_placeholder_runs(list(expanded_ids), placeholder) == list(raw_ids)


def qwen_image_tokens(processor: Any, height: int, width: int, factor: int) -> tuple[int, int]:
    """The Qwen-VL rule: an image already resized to multiples of ``factor`` (patch size x merge size) becomes one
    token per merged patch, and its placeholder is replaced by exactly those. Returns (tokens the placeholder
    becomes, vision tokens among them)."""
    tokens = (height // factor) * (width // factor)
    return tokens, tokens


def qwen_dummy_image(model: nn.Module, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The smallest valid image for a Qwen-VL-style tower (flattened patches + a (1, 3) grid): the keyword
    arguments of ``model.get_image_features``."""
    import torch

    vision = model.config.vision_config
    merge = int(getattr(vision, "spatial_merge_size", 2))
    patch = int(getattr(vision, "patch_size", 14))
    temporal = int(getattr(vision, "temporal_patch_size", 2))
    channels = int(getattr(vision, "in_channels", getattr(vision, "in_chans", 3)))
    dtype = next(model.parameters()).dtype
    pixels = torch.zeros(merge * merge, channels * temporal * patch * patch, dtype=dtype)
    grid = torch.tensor([[1, merge, merge]], dtype=torch.long)
    return {"pixel_values": pixels.to(device), "image_grid_thw": grid.to(device)}


@dataclass(frozen=True)
class Family:
    """One model family (one ``model_type``) as the trainer sees it.

    ``vision_modules``: names of the modules holding the vision (and audio) encoders and projectors; empty for a
    text-only family. ``placeholder_attributes``: the config attributes whose token ids are vision placeholders
    (banned from sampling: a sampled placeholder breaks the next forward); ``placeholder_tokenizer_attributes``:
    named tokenizer tokens that are placeholders too where the config has no id for them. ``mrope``: positions
    are Qwen-VL m-rope rows. ``dummy_image(model, device)``: ``get_image_features``' keyword arguments for the
    smallest image. ``expansion_matches(expanded, raw, processor, config)``: whether the processor's expanded
    prompt ids correspond to the engine's unexpanded ones. ``image_tokens(processor, height, width, factor)``: how
    many tokens one image placeholder becomes for an image of that (resized) size, and how many of them are vision
    tokens, known before any pixel is read (the prompt-length check). ``image_text(processor)``: the text the
    processor puts in place of one image placeholder when that does not depend on the image's size (prompt lengths
    are then counted by tokenizing it, since its tokens may merge with their neighbours). ``video_placeholder(
    processor, frames, height, width, fps, where)``: the text one video placeholder becomes and its vision tokens
    (``None``: the Qwen-VL processors' rule, ``easyr1.data.lengths.video_placeholder``).
    ``engine_token_map(config, tokenizer)``: token ids the rollout engine writes in its expanded prompt where the
    processor writes another (engine id -> trainer id), for the check that both expanded a prompt alike.
    ``token_types(input_ids, config)``: extra forward keyword arguments computed from the (expanded, padded or
    packed) ids, which the model builds its attention masks from (Gemma 3's ``token_type_ids``, 1 on image tokens:
    each image block attends to itself bidirectionally); the forward then passes the model no explicit mask of its
    own and shares no prompts, since either would replace those masks (``None``: plain causal attention).
    ``checkpoint_name(name)``: a weight's name as the family's checkpoints spell it (and vLLM, which loads them,
    expects), given the name transformers holds in memory or writes, where those drop a level the checkpoints have
    (``None``: the names as they are).
    How m-rope (``mrope``) places a video: ``video_timed_grids``: a video is one (t, h, w) grid whose temporal
    positions step by ``vision_config.tokens_per_second`` x its seconds per grid (Qwen2.5-VL);
    ``video_frames_as_grids``: each frame is its own (1, h, w) grid (Qwen3-VL, GLM-4.1V); neither: one grid stepping
    by 1 (Qwen2-VL). ``video_frame_markers``: the config attributes of the tokens opening and closing a video, for
    families whose video frames are image placeholder tokens (GLM-4.1V): the image tokens between them are video
    frames. ``pixel_bounds_frames``: how many frames the image processor's pixel bounds (``size``) count, 1 for
    most, the temporal patch for GLM-4.1V, whose processor bounds two copies of each image.
    ``forward_vision_inputs(input_ids, inputs, settings)``: one row's processor tensors rewritten into those the
    model's forward takes (``None``: as they are; GLM-4.1V passes video frames as images, see its module).
    ``checkpoint_transposed``: suffixes of parameter names that transformers keeps with their last two dimensions
    swapped relative to the checkpoint: transformers 5.19 transposes them on load but its ``save_pretrained`` does not
    transpose back (its shape check sees the in-memory shape), so the exports (:meth:`save_pretrained`) and the live
    weight sync into vLLM (which always transposes them on load; :meth:`engine_weights`) swap them back here.
    ``router_aux_loss``: a mixture-of-experts model whose routers transformers records as ``router_logits`` (a
    load-balancing loss can be added, ``worker.actor.model.router_aux_loss_coef``)."""

    model_type: str
    name: str
    vision_modules: tuple[str, ...] = ()
    placeholder_attributes: tuple[str, ...] = ("image_token_id", "video_token_id")
    placeholder_tokenizer_attributes: tuple[str, ...] = ()
    mrope: bool = False
    video_timed_grids: bool = False
    video_frames_as_grids: bool = False
    video_frame_markers: tuple[str, str] | None = None
    pixel_bounds_frames: int = 1
    dummy_image: Callable[[nn.Module, torch.device | str], dict[str, torch.Tensor]] | None = None
    forward_vision_inputs: Callable[[torch.Tensor, dict[str, torch.Tensor], Any], dict[str, Any]] | None = None
    expansion_matches: Callable[[Sequence[int], Sequence[int], Any, Any], bool] = qwen_expansion_matches
    image_tokens: Callable[[Any, int, int, int], tuple[int, int]] = qwen_image_tokens
    video_placeholder: Callable[[Any, int, int, int, float, str], tuple[str, int]] | None = None
    engine_token_map: Callable[[Any, Any], dict[int, int]] | None = None
    image_text: Callable[[Any], str] | None = None
    token_types: Callable[[torch.Tensor, Any], dict[str, torch.Tensor]] | None = None
    checkpoint_name: Callable[[str], str] | None = None
    checkpoint_transposed: tuple[str, ...] = ()
    router_aux_loss: bool = False
    tiny: TinyRecipe | None = field(default=None, compare=False)

    @property
    def has_vision(self) -> bool:
        """Whether the family has a vision tower."""
        return bool(self.vision_modules)

    def is_vision_module(self, name: str) -> bool:
        """Whether the dotted module or parameter ``name`` lies inside the vision (or audio) tower."""
        return any(part in self.vision_modules for part in name.split("."))

    def lora_exclude(self) -> str:
        """The default ``lora.exclude_modules`` regex: every module inside the tower (none for text-only models:
        a pattern that matches nothing)."""
        if not self.vision_modules:
            return r"(?!)"
        return r".*\b(" + "|".join(self.vision_modules) + r")\b.*"

    def token_type_inputs(self, input_ids: torch.Tensor, config: Any) -> dict[str, torch.Tensor]:
        """The forward's extra keyword arguments for ``input_ids`` (``token_types``); ``{}`` for causal families."""
        return {} if self.token_types is None else self.token_types(input_ids, config)

    def checkpoint_layout(self, name: str, tensor: T) -> T:
        """``tensor`` (the trainer's parameter ``name``) in the checkpoint's layout, the one vLLM loads."""
        if any(name.endswith(suffix) for suffix in self.checkpoint_transposed):
            return tensor.transpose(-2, -1)
        return tensor

    def engine_weights(self, named_tensors: Iterable[tuple[str, T]]) -> Iterator[tuple[str, T]]:
        """``named_tensors`` (transformers' in-memory names and layouts) under the names (``checkpoint_name``) and
        in the layouts (``checkpoint_transposed``) the engine loads, lazily: the actor's gather yields them one FSDP
        group at a time."""
        rename = self.checkpoint_name
        if rename is None and not self.checkpoint_transposed:
            return iter(named_tensors)
        return (
            (name if rename is None else rename(name), self.checkpoint_layout(name, tensor))
            for name, tensor in named_tensors
        )

    def save_pretrained(self, model: nn.Module, out_dir: str | Path) -> None:
        """``model.save_pretrained(out_dir)`` (safetensors) with the checkpoint's names and layouts, so that vLLM
        (and transformers) load it as a released checkpoint of the family."""
        if not self.checkpoint_transposed:
            model.save_pretrained(out_dir, safe_serialization=True)
        else:
            weights = model.state_dict().items()
            state = {name: self.checkpoint_layout(name, tensor).contiguous() for name, tensor in weights}
            # transformers' own revert would compare each transposed tensor's shape with the parameter's and
            # transpose it again; the family's conversion mapping holds only these transposes
            # (tests/test_family_qwen3_vl_moe.py), so skipping it skips nothing else
            model.save_pretrained(out_dir, state_dict=state, safe_serialization=True, save_original_format=False)
        self.rename_saved_weights(out_dir)

    def rename_saved_weights(self, directory: str | Path) -> None:
        """Rewrite the safetensors files ``save_pretrained`` wrote into ``directory`` (and their index) with the
        checkpoint names (``checkpoint_name``), so that vLLM loads the model; a no-op for most families."""
        if self.checkpoint_name is not None:
            rename_safetensors(Path(directory), self.checkpoint_name)

    def placeholder_token_ids(self, config: Any, tokenizer: Any = None) -> list[int]:
        """The vision placeholder token ids of a transformers ``config`` of this family (and of its ``tokenizer``,
        for the placeholders only the tokenizer names)."""
        values = [getattr(config, attribute, None) for attribute in self.placeholder_attributes]
        if tokenizer is not None:
            named = (getattr(tokenizer, attribute, None) for attribute in self.placeholder_tokenizer_attributes)
            values += [tokenizer.convert_tokens_to_ids(token) for token in named if token is not None]
        ids = []
        for value in values:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
        return ids
