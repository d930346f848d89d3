"""The Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) and the text-only causal LMs (Qwen2, Qwen3,
Llama). Their tiny models are built by ``easyr1.tools.tiny_model`` itself (the Qwen tokenizer and chat template are
its defaults)."""

from __future__ import annotations

from easyr1.models.families.base import QWEN_VISION_MODULES, Family, qwen_dummy_image


def _qwen_vl(model_type: str, name: str) -> Family:
    return Family(
        model_type=model_type,
        name=name,
        vision_modules=QWEN_VISION_MODULES,
        mrope=True,
        # Qwen2.5-VL steps a video's temporal positions by time; Qwen3-VL and Qwen3.5 give every frame its own grid
        video_timed_grids=model_type.startswith("qwen2_5"),
        video_frames_as_grids=model_type.startswith("qwen3"),
        dummy_image=qwen_dummy_image,
    )


FAMILIES = (
    _qwen_vl("qwen2_vl", "Qwen2-VL"),
    _qwen_vl("qwen2_5_vl", "Qwen2.5-VL"),
    _qwen_vl("qwen3_vl", "Qwen3-VL"),
    _qwen_vl("qwen3_5", "Qwen3.5, dense"),
    Family(model_type="qwen2", name="Qwen2 / Qwen2.5", placeholder_attributes=()),
    Family(model_type="qwen3", name="Qwen3", placeholder_attributes=()),
    Family(model_type="llama", name="Llama", placeholder_attributes=()),
)
