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


def _tiny_config(tokenizer: Any, shape: Any) -> Any:
    """The tiny Qwen3-VL-MoE: the tiny Qwen3-VL (``tools/tiny_model.py``: its attention, m-rope, vision tower and
    token ids) with every decoder layer's MLP a mixture of :data:`NUM_EXPERTS` experts (top :data:`TOP_K`)."""
    from transformers import Qwen3VLMoeConfig

    from easyr1.tools.tiny_model import _model_config  # at call time: tiny_model imports this package

    if shape.hidden_size % 32:
        raise ValueError(f"hidden_size {shape.hidden_size}: vLLM's CPU MoE kernel needs a multiple of 32")
    dense = _model_config("qwen3_vl", tokenizer, shape).to_dict()
    text = {key: value for key, value in dense["text_config"].items() if key != "model_type"}
    text.update(
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=MOE_INTERMEDIATE,
        intermediate_size=MOE_INTERMEDIATE,  # a dense MLP only serves mlp_only_layers (none)
        decoder_sparse_step=1,
        # transformers always renormalises the top-k weights and its text config drops the flag; vLLM reads it
        # (default False), so it is written out for vLLM to route as transformers does
        norm_topk_prob=True,
        tie_word_embeddings=False,  # the text config's flag is vLLM's, the top-level one transformers': equal
    )
    vision = {key: value for key, value in dense["vision_config"].items() if key != "model_type"}
    tokens = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return Qwen3VLMoeConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=False,
        dtype="float32",
        **{key: dense[key] for key in tokens},
    )


def _tiny_processor(tokenizer: Any) -> Any:
    """Qwen3-VL's processor, which Qwen3-VL-MoE ships, at the tiny Qwen3-VL's sizes."""
    from easyr1.tools.tiny_model import _processor

    return _processor("qwen3_vl", tokenizer)


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
