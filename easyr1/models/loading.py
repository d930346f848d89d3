"""Load Hugging Face models, tokenizers and processors for training and rollout.

:func:`load_model` reads a checkpoint on the CPU; :func:`build_empty_model` builds the same architecture with
its parameters on the meta device (no memory, no checkpoint read), for ranks that receive their weights from
rank 0 after sharding (``fsdp.enable_rank0_init``). :data:`CHECKPOINT_READS` counts the checkpoint reads of this
process, so tests can show that such a rank never read one.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
)


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# How many times this process has read a model checkpoint (from_pretrained) through load_model.
CHECKPOINT_READS = 0


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """Parse a dtype name; ``None`` means bf16 on GPU and fp32 on CPU (bf16 matmuls are slow on most CPUs)."""
    if name is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def default_attn_implementation(compute_dtype: torch.dtype) -> str:
    """The fastest attention that can run here: ``flash_attention_4`` (Hopper or newer, ``flash-attn-4``
    installed), else ``flash_attention_2`` (``flash-attn`` installed), on CUDA with a 16-bit compute dtype; else
    ``sdpa``.

    Flash attention handles packed (padding-free) rows as variable-length sequences; SDPA needs a dense
    block-diagonal mask over the whole packed row. Flash attention has no fp32 kernels, so fp32 compute keeps SDPA.
    Both flash packages install a module named ``flash_attn``, so they are told apart by their distribution names
    (transformers' availability checks), never by importing ``flash_attn``.
    """
    half = compute_dtype in (torch.bfloat16, torch.float16)
    if not (half and torch.cuda.is_available()):
        return "sdpa"
    from transformers import utils

    flash_attn_4 = getattr(utils, "is_flash_attn_4_available", lambda: False)  # newer transformers only
    if torch.cuda.get_device_capability()[0] >= 9 and flash_attn_4():
        return "flash_attention_4"
    if utils.is_flash_attn_2_available():
        return "flash_attention_2"
    return "sdpa"


def is_vision_language(config: PretrainedConfig) -> bool:
    """Whether the model has a vision tower (and so needs a processor and m-rope position ids)."""
    return getattr(config, "vision_config", None) is not None


def apply_config_overrides(config: PretrainedConfig, override: dict[str, Any]) -> None:
    """Set ``override``'s entries on ``config`` in place (``model.override_config``).

    A dict given for a nested config (``text_config``, ``vision_config``) updates that config's entries instead
    of replacing it, as vLLM's ``hf_overrides`` does, so every engine reads one override the same way.
    """
    for key, value in override.items():
        nested = getattr(config, key, None)
        if isinstance(nested, PretrainedConfig) and isinstance(value, dict):
            apply_config_overrides(nested, value)
        else:
            setattr(config, key, value)


def load_model_config(model_path: str, trust_remote_code: bool = False, override: dict[str, Any] | None = None):
    """The model's config with ``override`` applied (e.g. dropout or rope settings from the YAML)."""
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    apply_config_overrides(config, override or {})
    return config


def _model_class(config: PretrainedConfig) -> type:
    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def load_model(
    model_path: str,
    dtype: torch.dtype,
    *,
    trust_remote_code: bool = False,
    override_config: dict[str, Any] | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load the weights on CPU in ``dtype``; vision-language or causal LM by config.

    ``attn_implementation`` ``None`` picks :func:`default_attn_implementation` for ``dtype``; pass it explicitly
    when the model will compute in another dtype (mixed precision).
    """
    global CHECKPOINT_READS
    config = load_model_config(model_path, trust_remote_code, override_config)
    CHECKPOINT_READS += 1
    return _model_class(config).from_pretrained(
        model_path,
        config=config,
        dtype=dtype,
        attn_implementation=attn_implementation or default_attn_implementation(dtype),
        trust_remote_code=trust_remote_code,
    )


def build_empty_model(
    model_path: str,
    dtype: torch.dtype,
    *,
    trust_remote_code: bool = False,
    override_config: dict[str, Any] | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The architecture :func:`load_model` would return, every parameter and buffer on the meta device.

    Only ``config.json`` is read. The tensors take no memory and hold no values: shard the model, then
    allocate the shards and fill them from rank 0 (:func:`easyr1.distributed.fsdp.broadcast_full_weights`).
    """
    config = load_model_config(model_path, trust_remote_code, override_config)
    with torch.device("meta"):
        model = _model_class(config).from_config(
            config,
            dtype=dtype,
            attn_implementation=attn_implementation or default_attn_implementation(dtype),
            trust_remote_code=trust_remote_code,
        )
    # match what from_pretrained returns: eval mode, and the checkpoint's generation config (EOS ids)
    model.eval()
    try:
        model.generation_config = GenerationConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except OSError:  # no generation_config.json: from_pretrained keeps the one derived from the config too
        pass
    return model


def load_tokenizer_and_processor(path: str, trust_remote_code: bool = False):
    """The tokenizer, and the multimodal processor when the model has one (``None`` for text-only models)."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    processor = None
    if is_vision_language(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)):
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    return tokenizer, processor


def pad_token_id(tokenizer: Any) -> int:
    """The id that pads prompts and responses everywhere (dataset, engines, agent trajectories): the tokenizer's pad
    token, or its end-of-sequence token when it has none (as transformers' ``generate`` does)."""
    from easyr1.errors import DataError

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise DataError(f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'the model')} has no pad or eos token")
    return int(pad)
