"""Load Hugging Face models, tokenizers and processors for training and rollout."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
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


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """Parse a dtype name; ``None`` means bf16 on GPU and fp32 on CPU (bf16 matmuls are slow on most CPUs)."""
    if name is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def is_vision_language(config: PretrainedConfig) -> bool:
    """Whether the model has a vision tower (and so needs a processor and m-rope position ids)."""
    return getattr(config, "vision_config", None) is not None


def load_model_config(model_path: str, trust_remote_code: bool = False, override: dict[str, Any] | None = None):
    """The model's config with ``override`` applied (e.g. dropout or rope settings from the YAML)."""
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    for key, value in (override or {}).items():
        setattr(config, key, value)
    return config


def load_model(
    model_path: str,
    dtype: torch.dtype,
    *,
    trust_remote_code: bool = False,
    override_config: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """Load the weights on CPU in ``dtype`` with sdpa attention; vision-language or causal LM by config."""
    config = load_model_config(model_path, trust_remote_code, override_config)
    model_cls = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    model = model_cls.from_pretrained(
        model_path, config=config, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code
    )
    return model


def load_tokenizer_and_processor(path: str, trust_remote_code: bool = False):
    """The tokenizer, and the multimodal processor when the model has one (``None`` for text-only models)."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    processor = None
    if is_vision_language(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)):
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    return tokenizer, processor
