"""The shapes of published Qwen2.5-VL checkpoints (3B, 7B, 32B, 72B), written as ``config.json`` directories.

No weights can be downloaded here, and a plan needs only the config: these let the plan be checked against EasyR1's
published baselines (``bench/plan_baselines.py``) and the refusal of a run too large for its device be tested. Values
are the checkpoints' own ``config.json`` fields that size the model; the rest are transformers' defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}

# name -> (hidden, intermediate, layers, heads, kv_heads, vocab, tied embeddings)
_TEXT = {
    "qwen2.5-vl-3b": (2048, 11008, 36, 16, 2, 151936, True),
    "qwen2.5-vl-7b": (3584, 18944, 28, 28, 4, 152064, False),
    "qwen2.5-vl-32b": (5120, 27648, 64, 40, 8, 152064, False),
    "qwen2.5-vl-72b": (8192, 29568, 80, 64, 8, 152064, False),
}

REFERENCE_MODELS = tuple(_TEXT)


def reference_config(name: str) -> dict[str, Any]:
    """The ``config.json`` content of the reference model ``name`` (one of :data:`REFERENCE_MODELS`)."""
    hidden, intermediate, layers, heads, kv_heads, vocab, tied = _TEXT[name]
    text = {
        "model_type": "qwen2_5_vl_text",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": tied,
    }
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "text_config": text,
        "vision_config": {**_VISION, "out_hidden_size": hidden},
        "tie_word_embeddings": tied,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "dtype": "bfloat16",
    }


def write_reference_model(name: str, directory: str | Path) -> Path:
    """Write ``config.json`` of ``name`` into ``directory`` (created); returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(reference_config(name), indent=2))
    return directory
