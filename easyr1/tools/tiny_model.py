"""Build a tiny, randomly initialised Qwen-VL (or text-only) model directory that loads like a real checkpoint.

The directory holds a model (fp32 safetensors), a byte-level BPE tokenizer trained here on a few KB of text
(about 350 tokens, Qwen's special tokens and chat template), a processor with small image sizes (vision-language
families only) and a generation config. Tests, the CPU demo and the examples use it instead of a downloaded
checkpoint:
``python -m easyr1.tools.tiny_model OUT_DIR [--family qwen2_5_vl] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from easyr1.models.families.base import qwen_turns_chat_template


if TYPE_CHECKING:
    from transformers import PretrainedConfig, ProcessorMixin, Qwen2Tokenizer

    from easyr1.models.families import TinyRecipe


VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")  # the Qwen-VL families, built here
TEXT_FAMILIES = ("qwen2", "qwen3", "llama")  # causal LMs without a vision tower or processor


def _recipe_families() -> tuple[str, ...]:
    """The families whose module (``easyr1/models/families/``) carries its own tiny recipe."""
    from easyr1.models.families import FAMILIES as REGISTRY

    return tuple(model_type for model_type, family in REGISTRY.items() if family.tiny is not None)


# Families with their own tiny recipe (their tokens, chat template, config and processor come from their module).
RECIPE_FAMILIES = _recipe_families()
FAMILIES = VISION_FAMILIES + TEXT_FAMILIES + RECIPE_FAMILIES

# Qwen's special tokens, in Qwen's order; they take the ids right after the BPE vocabulary, as in Qwen.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
BPE_VOCAB_SIZE = 336  # + 14 special tokens = 350, the size at which the demo task is known to be learnable
COLOUR_WORDS = ("red", "green", "blue", "yellow")
# How often each extra word is repeated (per line, twice over): enough for BPE to merge it ahead of other pairs.
_EXTRA_WORD_REPEATS = 24

# Qwen2's pre-tokenizer split: letters stay together (with at most one leading non-letter such as a space),
# every digit is its own piece, so digits are single tokens whatever the merges are.
QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The Qwen2-VL chat format: a default system message, one <|im_start|>role ... <|im_end|> block per message,
# an image content part rendered as <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad).
CHAT_TEMPLATE = qwen_turns_chat_template(
    "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>"
)

# Per family: vision patch size and the processor's pixel bounds (4 to 16 image tokens per image).
_FAMILY_SETTINGS = {
    "qwen2_vl": {"patch_size": 14, "min_pixels": 56 * 56, "max_pixels": 112 * 112},
    "qwen2_5_vl": {"patch_size": 14, "min_pixels": 56 * 56, "max_pixels": 112 * 112},
    "qwen3_vl": {"patch_size": 16, "min_pixels": 64 * 64, "max_pixels": 128 * 128},
    "qwen3_5": {"patch_size": 16, "min_pixels": 64 * 64, "max_pixels": 128 * 128},  # Qwen3-VL's processor
}


@dataclass(frozen=True)
class TextShape:
    """Sizes of the language model; the defaults are the tiny model the demo and the tests use (0.8 M parameters
    with its vision tower). The head dimension stays 32 (``hidden_size / num_heads``): the m-rope sections and
    vLLM's CPU attention assume it."""

    hidden_size: int = 128
    num_layers: int = 2
    intermediate_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2

    def __post_init__(self) -> None:
        if self.hidden_size != 32 * self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be 32 * num_heads ({self.num_heads}): the tiny models keep "
                "head_dim 32; pass num_heads=hidden_size // 32"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if min(self.num_layers, self.intermediate_size) < 1:
            raise ValueError(f"num_layers and intermediate_size must be positive, got {self}")


def _training_text(extra_words: Sequence[str] = ()) -> str:
    """A few KB of text covering the demo prompts, the format prompts and the chat template's fixed parts.

    Colour words and ``extra_words`` are repeated often, with and without a leading space, so that BPE merges each
    into one token. Without extra words the text is exactly the shape demo's.
    """
    from easyr1.tools.shape_task import COLOURS, PROMPT, SHAPES

    template_parts = ["You are a helpful assistant.", "system\nuser\nassistant\n"] * 8
    lines = [
        *template_parts,
        PROMPT,
        PROMPT.replace("<image>", ""),
        "What colour is the shape? What color is the shape? The shape is",
        "A question about the image. Look at the image and answer the question.",
        "First think about the problem step by step inside <think> </think> tags,",
        "then give the final answer inside \\boxed{} or inside <answer> </answer> tags.",
        "Solve the following problem. The answer is a number.",
        "What is 3 + 4? What is 12 - 5? What is 6 * 7? Compute 81 / 9 and 2 + 2 = 4.",
        "circle square triangle shape image picture colour color background white grey",
        "The answer is 0 1 2 3 4 5 6 7 8 9 10 11 12 100 2048.",
        "Hello world! This is a tiny tokenizer for tests; it is small, fast and offline.",
    ]
    for shape in SHAPES:
        for colour in COLOURS:
            lines.append(f"The {shape} is {colour}. {colour}\n{colour} {shape}: {colour}, {colour}!")
    for colour in COLOUR_WORDS:
        lines.append(" ".join([colour] * 12))
        lines.append("\n".join([colour] * 12))
    for word in extra_words:
        lines.append(" ".join([word] * _EXTRA_WORD_REPEATS))
        lines.append("\n".join([word] * _EXTRA_WORD_REPEATS))
    return "\n".join(lines * 2) + "\n"


def _check_extra_words(extra_words: Sequence[str]) -> tuple[str, ...]:
    """``extra_words`` as a tuple; ValueError for a word BPE cannot make one token (not letters only)."""
    if isinstance(extra_words, str):
        raise ValueError(f"extra_words must be a sequence of words, not the string {extra_words!r}")
    for word in extra_words:
        # Qwen's pre-tokenizer splits letters from everything else, so only a run of letters can be one token.
        if not isinstance(word, str) or not word.isalpha():
            raise ValueError(f"extra word {word!r} must be letters only, to become a single token")
    return tuple(extra_words)


def build_tokenizer(
    extra_words: Sequence[str] = (),
    family_tokens: Sequence[str] = (),
    chat_template: str | None = None,
    named_tokens: Sequence[tuple[str, str]] = (),
    literal_tokens: Sequence[str] = (),
) -> Qwen2Tokenizer:
    """Train the tiny byte-level BPE tokenizer and wrap it as the Qwen2 tokenizer class transformers uses.

    ``extra_words`` become single tokens (with and without a leading space) besides the colour words; without them
    the tokenizer is exactly the shape demo's. ``family_tokens``: special tokens of another family (its image
    placeholders), given the ids after Qwen's; ``chat_template``: that family's template instead of Qwen's;
    ``named_tokens``: ``(attribute, token)`` pairs, the tokenizer's names for some of ``family_tokens``
    (``tokenizer.boi_token``); ``literal_tokens``: ordinary tokens added whole after the special ones (``"\\n\\n"``
    as one token whose vocabulary entry is the string itself, as in Gemma's vocabulary).
    """
    extra_words = _check_extra_words(extra_words)
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(extra_words).splitlines(keepends=True), trainer=trainer)
    state = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges = [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in state["model"]["merges"]
    ]

    base_size = len(vocab)
    # Give the special tokens their ids in the vocabulary itself: the constructor registers eos/pad first, which
    # would otherwise put them out of Qwen's order.
    special = (*SPECIAL_TOKENS, *(token for token in family_tokens if token not in SPECIAL_TOKENS))
    full_vocab = {**vocab, **{token: base_size + i for i, token in enumerate(special)}}
    qwen_tokenizer = Qwen2Tokenizer(
        vocab=full_vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[token for token in special if token not in ("<|im_end|>", "<|endoftext|>")],
        model_max_length=8192,
        # named model-specific tokens: tokenizer.<name> and tokenizer.<name>_id, written to tokenizer_config.json
        **({"model_specific_special_tokens": dict(named_tokens)} if named_tokens else {}),
    )
    qwen_tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    qwen_tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in literal_tokens])
    qwen_tokenizer.chat_template = chat_template or CHAT_TEMPLATE
    _check_tokenizer(qwen_tokenizer, base_size=base_size, words=COLOUR_WORDS + extra_words)
    return qwen_tokenizer


def _check_tokenizer(tokenizer: Qwen2Tokenizer, base_size: int, words: Sequence[str] = COLOUR_WORDS) -> None:
    """Fail loudly if training did not give the properties the demo and the tests rely on."""
    ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS]
    if ids != list(range(base_size, base_size + len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens did not get contiguous ids after the BPE vocabulary: {ids}")
    for word in words:
        for text in (word, " " + word):
            pieces = tokenizer.encode(text, add_special_tokens=False)
            if len(pieces) != 1:
                raise RuntimeError(f"{text!r} is not a single token in the tiny tokenizer: {pieces}")


def _model_config(family: str, tokenizer: Qwen2Tokenizer, shape: TextShape | None = None) -> PretrainedConfig:
    """The transformers config of the tiny model for ``family``, with token ids taken from ``tokenizer`` and the
    language model's sizes from ``shape`` (the default shape when ``None``)."""
    shape = shape or TextShape()
    from transformers import (
        LlamaConfig,
        Qwen2_5_VLConfig,
        Qwen2Config,
        Qwen2VLConfig,
        Qwen3_5Config,
        Qwen3Config,
        Qwen3VLConfig,
    )

    token_ids = {
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        "vision_start_token_id": tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        "vision_end_token_id": tokenizer.convert_tokens_to_ids("<|vision_end|>"),
    }
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,  # head_dim 32: vLLM's CPU attention needs head_dim >= 32
        "num_key_value_heads": shape.num_kv_heads,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "dtype": "float32",
    }
    if family in TEXT_FAMILIES:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
        text_config = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[family]
        return text_config(**text, **({"head_dim": 32} if family == "qwen3" else {}), tie_word_embeddings=False)
    patch_size = _FAMILY_SETTINGS[family]["patch_size"]
    common = {"tie_word_embeddings": False, "dtype": "float32", **token_ids}
    if family == "qwen2_vl":
        # mrope_section splits the 16 rotary frequencies of head_dim 32 into (t, h, w) like Qwen's [16, 24, 24].
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 6, 6]}
        vision = {
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": shape.hidden_size,  # Qwen2-VL's merger output width = the language model's hidden size
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": patch_size,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
        return Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen2_5_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 6, 6]}
        vision = {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": shape.hidden_size,
            "patch_size": patch_size,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],  # one windowed block, one full-attention block, like Qwen2.5-VL
        }
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen3_vl":
        text["head_dim"] = 32
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [6, 5, 5],  # Qwen3-VL's [24, 20, 20] scaled to 16 frequencies
            "mrope_interleaved": True,  # transformers always interleaves for Qwen3-VL; vLLM reads this flag
        }
        vision = {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": shape.hidden_size,
            "patch_size": patch_size,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 256,  # a 16x16 grid, interpolated to the image grid
            "deepstack_visual_indexes": [0],  # one deepstack feature, injected into the first decoder layer
        }
        return Qwen3VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen3_5":
        return Qwen3_5Config(text_config=_qwen3_5_text(text, shape), vision_config=_qwen3_5_vision(shape), **common)
    raise ValueError(f"unknown model family {family!r}; choose one of {', '.join(FAMILIES)}")


def _qwen3_5_text(text: dict, shape: TextShape) -> dict:
    """Qwen3.5's language model settings on top of the shared ``text`` ones: GatedDeltaNet (linear attention) and
    full attention layers alternating, the first one linear, so the default two layers hold one of each."""
    return {
        **text,
        # Qwen3.5's attention heads are 64 wide with a quarter of each rotated: 8 rotary frequencies, split (t, h, w)
        # like Qwen3.5's [11, 11, 10] and interleaved as transformers always does for it (vLLM reads the flag).
        "head_dim": 64,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "layer_types": ["linear_attention" if i % 2 == 0 else "full_attention" for i in range(shape.num_layers)],
        "linear_conv_kernel_dim": 4,  # the only width vLLM's CPU conv kernel takes
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        # vLLM-CPU's GatedDeltaNet kernel refuses head dims of 32 ("Unexpected head dim size"); 64 runs there
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "tie_word_embeddings": False,  # the text config's flag is vLLM's, the top-level one transformers': equal
    }


def _qwen3_5_vision(shape: TextShape) -> dict:
    """Qwen3.5's vision tower at the tiny size: Qwen3-VL's without deepstack, its output as wide as the text."""
    return {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": shape.hidden_size,
        "patch_size": _FAMILY_SETTINGS["qwen3_5"]["patch_size"],
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 256,  # a 16x16 grid, interpolated to the image grid
    }


def _processor(family: str, tokenizer: Qwen2Tokenizer) -> ProcessorMixin:
    """The AutoProcessor-loadable processor for ``family`` with small image sizes."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    settings = _FAMILY_SETTINGS[family]
    size = {"shortest_edge": settings["min_pixels"], "longest_edge": settings["max_pixels"]}
    vision = {"patch_size": settings["patch_size"], "temporal_patch_size": 2, "merge_size": 2}
    if family in ("qwen3_vl", "qwen3_5"):
        # Qwen3-VL (and Qwen3.5, which ships Qwen3-VL's processor) normalises with mean = std = 0.5 instead of
        # CLIP's statistics.
        half = [0.5, 0.5, 0.5]
        image_processor = Qwen2VLImageProcessor(size=size, image_mean=half, image_std=half, **vision)
        video_processor = Qwen3VLVideoProcessor(
            size={"shortest_edge": settings["min_pixels"], "longest_edge": 4 * settings["max_pixels"]},
            image_mean=half,
            image_std=half,
            fps=2,
            min_frames=2,
            max_frames=16,
            cap_pixels_per_frame=True,
            **vision,
        )
        return Qwen3VLProcessor(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessor(size=size, **vision)
    video_processor = Qwen2VLVideoProcessor(
        size=size, min_frames=2, max_frames=16, cap_pixels_per_frame=True, **vision
    )
    processor_class = Qwen2VLProcessor if family == "qwen2_vl" else Qwen2_5_VLProcessor
    return processor_class(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)


def _recipe(family: str) -> TinyRecipe | None:
    """The family module's tiny recipe (``None`` for the families built here)."""
    from easyr1.models.families import FAMILIES as REGISTRY

    return REGISTRY[family].tiny if family in RECIPE_FAMILIES else None


def build_tiny_model(
    out_dir: str | Path,
    family: str = "qwen2_5_vl",
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    intermediate_size: int = 256,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    extra_words: Sequence[str] = (),
    stop_tokens: int = 0,
) -> Path:
    """Write a tiny random ``family`` model, its tokenizer, processor (vision families) and generation config
    into ``out_dir``.

    The keyword arguments size the language model (the vision tower stays the same, its output width follows
    ``hidden_size``); the defaults build the 0.8 M-parameter model the demo and the tests use. ``num_heads``
    defaults to ``hidden_size // 32`` (head_dim 32), ``num_kv_heads`` to half of it. The same seed and sizes give
    byte-identical weights. ``qwen3_5`` keeps head_dim 64 (a quarter of it rotated, as Qwen3.5 does) and alternates
    GatedDeltaNet (linear-attention) and full-attention layers, the first linear. ``extra_words`` become single
    tokens of the tokenizer (the agent demo's action words); the default builds the shape demo's tokenizer.
    ``stop_tokens=K``: K more tokens (the first K of the BPE vocabulary) end a response, as EOS does
    (``generation_config.eos_token_id``): a random model then stops after a roughly geometric number of tokens, the
    long-tailed lengths the schedule benches and tests need (a random model otherwise almost never samples EOS).
    Returns ``out_dir`` as a Path.
    """
    heads = num_heads if num_heads is not None else max(hidden_size // 32, 1)
    shape = TextShape(
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
        num_heads=heads,
        num_kv_heads=num_kv_heads if num_kv_heads is not None else max(heads // 2, 1),
    )
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

    from easyr1.models.families import family_of

    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {', '.join(FAMILIES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recipe = _recipe(family)
    processor = None
    if recipe is None:
        tokenizer = build_tokenizer(extra_words)
        config = _model_config(family, tokenizer, shape)
        causal = family in TEXT_FAMILIES
        if family in VISION_FAMILIES:
            processor = _processor(family, tokenizer)
    else:
        tokenizer = build_tokenizer(
            extra_words, recipe.special_tokens, recipe.chat_template, recipe.named_tokens, recipe.literal_tokens
        )
        config = recipe.config(tokenizer, shape)
        causal = recipe.model_class == "causal"
        if recipe.processor is not None:
            processor = recipe.processor(tokenizer)

    # Seed a private generator state so building a model does not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model_class = AutoModelForCausalLM if causal else AutoModelForImageTextToText
        model = model_class.from_config(config, dtype=torch.float32)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    stops = [eos_id, pad_id, *range(stop_tokens)]
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=stops, pad_token_id=pad_id)
    family_of(config).save_pretrained(model, out_dir)  # the names and layout the family's checkpoints have
    if processor is not None:
        processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """Command line entry point: build a tiny model directory."""
    parser = argparse.ArgumentParser(description="Build a tiny random Qwen-VL model directory for tests and demos.")
    parser.add_argument("out_dir", help="directory to write the model into (created if missing)")
    parser.add_argument("--family", default="qwen2_5_vl", choices=FAMILIES, help="model architecture")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--hidden-size", type=int, default=128, help="language model width (head_dim stays 32; qwen3_5: 64)"
    )
    parser.add_argument("--num-layers", type=int, default=2, help="language model layers")
    parser.add_argument("--intermediate-size", type=int, default=256, help="language model MLP width")
    parser.add_argument("--stop-tokens", type=int, default=0, help="more tokens that end a response, as EOS does")
    args = parser.parse_args(argv)
    path = build_tiny_model(
        args.out_dir,
        family=args.family,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        stop_tokens=args.stop_tokens,
    )
    print(f"wrote a tiny {args.family} model to {path}")


if __name__ == "__main__":
    main()
