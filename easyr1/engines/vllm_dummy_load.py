"""Start the vLLM engine without reading the checkpoint: the actor's first weight sync fills it.

vLLM's ``load_format="dummy"`` randomises every parameter *and every persistent buffer* of the model it built.
The parameters are what the sync writes; some buffers are not checkpoint tensors at all but values the model
computes at construction from its configs, which no sync sends: the Qwen-VL vision towers' pixel normalisation
(vLLM's ``FusedMMInputNorm``: ``visual.input_norm.weight`` / ``.bias``, ``rescale_factor / image_std`` and
``-image_mean / image_std`` from the processor config), which vLLM folds into the model where transformers' image
processor does it before the model. Randomised, every image prompt's log-probs were off by up to 0.7.

:class:`SyncFilledLoader` (``load_format`` :data:`LOAD_FORMAT`) is vLLM's dummy loader that keeps each buffer's
constructed value, so that after the first sync the engine holds what a checkpoint load would have given it; and
it marks the model, so that the first sync must prove it wrote every parameter (:func:`check_first_sync`, names
only, from the set the model's ``load_weights`` returns, as vLLM's own strict load checks) before any generate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


# the load format easyr1 registers with vLLM; ``worker.rollout.load_format=dummy`` selects it
LOAD_FORMAT = "easyr1_dummy"
# set on the model by the loader: the parameter names no sync has written yet
UNSYNCED_ATTRIBUTE = "_easyr1_unsynced_parameters"
_registered = False  # vLLM's loader registry is per process


def register() -> None:
    """Register :class:`SyncFilledLoader` with vLLM under :data:`LOAD_FORMAT` (once per process)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(LOAD_FORMAT)
    class SyncFilledLoader(DummyModelLoader):
        """vLLM's dummy loader, but buffers keep the values the model computed at construction (not checkpoint
        tensors: the sync does not send them), and the model is marked for :func:`check_first_sync`."""

        def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
            constructed = [
                (buffer, buffer.detach().clone())
                for module in model.modules()
                for buffer in module._buffers.values()
                if buffer is not None and not buffer.is_meta
            ]
            super().load_weights(model, model_config)
            with torch.no_grad():
                for buffer, value in constructed:
                    buffer.copy_(value)
            setattr(model, UNSYNCED_ATTRIBUTE, {name for name, _ in model.named_parameters()})

    _registered = True


def needs_checkpoint(model_path: str, model_config: Any) -> str | None:
    """Why the engine of ``model_path`` must load its checkpoint after all, or ``None``.

    A config that says the word embeddings are tied while the checkpoint has an ``lm_head`` of its own: vLLM then
    builds an untied ``lm_head`` and re-ties it only if the loaded values equal the embeddings (as transformers
    decides for the actor), which random values never do. The engine would keep a separate ``lm_head`` that an
    actor with tied embeddings never sends. Reads the safetensors headers only (tensor names, as vLLM does)."""
    from vllm.transformers_utils.config import checkpoint_has_lm_head

    configs = (model_config, model_config.get_text_config())
    if any(getattr(config, "tie_word_embeddings", False) for config in configs) and checkpoint_has_lm_head(model_path):
        return "the config ties the word embeddings, but the checkpoint has an lm_head whose values decide the tie"
    return None


def check_first_sync(worker: Any, loaded: Iterable[str] | None) -> None:
    """Run on the engine's worker after a sync whose ``load_weights`` returned ``loaded`` (vLLM's parameter names):
    in an engine started without the checkpoint, a parameter that no sync has written yet still holds random
    values, so the first sync must reach every one; a ``RuntimeError`` names those it missed. A no-op for an engine
    loaded from the checkpoint and after the first complete sync."""
    model = worker.model_runner.get_model()
    unsynced: set[str] | None = getattr(model, UNSYNCED_ATTRIBUTE, None)
    if not unsynced:
        return
    if loaded is None:
        raise RuntimeError(f"{type(model).__name__}.load_weights reported no names: the sync's coverage is unknown")
    unsynced -= set(loaded)
    if unsynced:
        names = sorted(unsynced)
        shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise RuntimeError(
            f"the engine was started without its checkpoint (worker.rollout.load_format=dummy), and the weight sync "
            f"did not write {len(names)} of its parameters, which hold random values: {shown}; "
            "set worker.rollout.load_format=auto to load the checkpoint"
        )


def reload_weights(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run on the engine's worker (``collective_rpc``): vLLM's ``reload_weights`` of ``weights``, then
    :func:`check_first_sync` with the names the model's ``load_weights`` returned (vLLM's reload drops them)."""
    model = worker.model_runner.get_model()
    load_weights = model.load_weights
    loaded: set[str] = set()

    def recording_load_weights(*args: Any, **kwargs: Any) -> Any:
        names = load_weights(*args, **kwargs)
        loaded.update(names or ())
        return names

    model.load_weights = recording_load_weights  # an instance attribute, removed below: the class's method again
    try:
        worker.model_runner.reload_weights(weights_iterator=weights)
    finally:
        del model.load_weights
    check_first_sync(worker, loaded)
