"""Qwen3-VL-MoE (``qwen3_vl_moe``, e.g. Qwen3-VL-30B-A3B): Qwen3-VL's vision tower, m-rope, deepstack and processor
in front of a mixture-of-experts language model.

What differs from Qwen3-VL is the decoder's MLP: a router (a bare ``(E, H)`` Parameter, top-k renormalised) and
the experts of each layer as two 3-D Parameters, ``gate_up_proj (E, 2I, H)`` and ``down_proj (E, H, I)``. So:

- LoRA reaches attention only: peft's ``target_modules`` wrap ``nn.Linear`` modules, and neither the experts nor
  the router are one, so the default ``all-linear`` (the vision tower excluded) adapts q/k/v/o_proj and nothing else.
- transformers keeps the experts transposed relative to the checkpoint (``(E, H, 2I)`` and ``(E, I, H)``, the
  layout of the released checkpoints and the one vLLM loads). It transposes them on load, but 5.19's
  ``save_pretrained`` does not transpose them back; the exports and the live sync into vLLM do
  (``checkpoint_transposed``, ``Family.save_pretrained``, ``Family.checkpoint_layout``).
- The router's load-balancing loss is transformers' (``output_router_logits``), added to the policy loss only when
  ``worker.actor.model.router_aux_loss_coef`` is set (``easyr1/models/moe.py``).
"""

from __future__ import annotations

from typing import Any

from easyr1.models.families.base import QWEN_VISION_MODULES, Family, TinyRecipe, qwen_dummy_image


# The tiny model's mixture: few, narrow experts. 2 * MOE_INTERMEDIATE must differ from the hidden size: transformers
# decides whether to transpose a fused expert tensor on load by its shape, and a square one would load untransposed.
NUM_EXPERTS = 4
TOP_K = 2
MOE_INTERMEDIATE = 96


# The tiny Qwen3-VL's processor bounds: 16-pixel patches merged 2x2, 4 to 16 image tokens per image.
_PATCH, _MIN_PIXELS, _MAX_PIXELS = 16, 64 * 64, 128 * 128


def _tiny_config(tokenizer: Any, shape: Any) -> Any:
    """The tiny Qwen3-VL-MoE: the tiny Qwen3-VL's attention, m-rope and vision tower (``tools/tiny_model.py``), with
    every decoder layer's MLP a mixture of :data:`NUM_EXPERTS` experts (top :data:`TOP_K`)."""
    from transformers import Qwen3VLMoeConfig

    if shape.hidden_size % 32:
        raise ValueError(f"hidden_size {shape.hidden_size}: vLLM's CPU MoE kernel needs a multiple of 32")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": 32,  # vLLM's CPU attention needs head_dim >= 32
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "bos_token_id": pad_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": pad_id,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [6, 5, 5],  # Qwen3-VL's [24, 20, 20] scaled to 16 frequencies
            "mrope_interleaved": True,  # transformers always interleaves; vLLM reads the flag
        },
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "intermediate_size": MOE_INTERMEDIATE,  # a dense MLP only serves mlp_only_layers (none)
        "decoder_sparse_step": 1,
        # transformers always renormalises the top-k weights and its text config drops the flag; vLLM reads it
        # (default False), so it is written out for vLLM to route as transformers does
        "norm_topk_prob": True,
        "tie_word_embeddings": False,  # the text config's flag is vLLM's, the top-level one transformers': equal
        "dtype": "float32",
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": shape.hidden_size,
        "patch_size": _PATCH,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 256,  # a 16x16 grid, interpolated to the image grid
        "deepstack_visual_indexes": [0],  # one deepstack feature, injected into the first decoder layer
    }
    tokens = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    return Qwen3VLMoeConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=False,
        dtype="float32",
        **{key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()},
    )


def _tiny_processor(tokenizer: Any) -> Any:
    """Qwen3-VL's processor (Qwen3-VL-MoE ships the same one) at the tiny Qwen3-VL's sizes: mean = std = 0.5."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    half = [0.5, 0.5, 0.5]
    patches = {"patch_size": _PATCH, "temporal_patch_size": 2, "merge_size": 2}
    size = {"shortest_edge": _MIN_PIXELS, "longest_edge": _MAX_PIXELS}
    image_processor = Qwen2VLImageProcessor(size=size, image_mean=half, image_std=half, **patches)
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": _MIN_PIXELS, "longest_edge": 4 * _MAX_PIXELS},
        image_mean=half,
        image_std=half,
        fps=2,
        min_frames=2,
        max_frames=16,
        cap_pixels_per_frame=True,
        **patches,
    )
    return Qwen3VLProcessor(image_processor, tokenizer, video_processor, chat_template=tokenizer.chat_template)


FAMILIES = (
    Family(
        model_type="qwen3_vl_moe",
        name="Qwen3-VL-MoE",
        vision_modules=QWEN_VISION_MODULES,
        mrope=True,
        video_frames_as_grids=True,  # as Qwen3-VL: every video frame its own (1, h, w) grid
        dummy_image=qwen_dummy_image,
        checkpoint_transposed=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
        router_aux_loss=True,
        tiny=TinyRecipe(config=_tiny_config, processor=_tiny_processor),
    ),
)
