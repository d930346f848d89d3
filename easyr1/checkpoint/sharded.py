"""One model's training state as a sharded ``torch.distributed.checkpoint`` directory, written by every rank.

A component directory (``global_step_N/actor`` or ``global_step_N/critic``) holds::

    model/                    DCP shards of the weights (each rank writes its own shard; any world size can load)
    optimizer/                DCP shards of the optimizer state (absent when saved with ``save_model_only``)
    extra_state_rank_<r>.pt   rank r's learning-rate scheduler and RNG states (python, numpy, torch, cuda), as
                              tensors and plain values only: read back with ``torch.load(weights_only=True)``
    huggingface/              config, generation config, tokenizer and processor files (rank 0), which
                              ``scripts/model_merger.py`` turns into a Hugging Face model together with ``model/``

Files are fsynced before the call returns, so the driver can commit the step directory by renaming it.

The ``.pt`` state files of a checkpoint (these and the driver's ``trainer_state.pt``) are read by
:func:`load_state_file`: torch's weights-only unpickler, so a file that holds anything but tensors, numbers, strings,
lists, tuples and dicts is refused before any of it runs. The DCP directories' ``.metadata`` pickles are checked by
:func:`~easyr1.checkpoint.dcp_metadata.check_dcp_metadata` before torch reads them.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from easyr1.checkpoint.dcp_metadata import check_dcp_metadata
from easyr1.errors import CheckpointError, UserError


MODEL_DIR = "model"
OPTIMIZER_DIR = "optimizer"
HF_DIR = "huggingface"


def extra_state_name(rank: int) -> str:
    """File name of one rank's scheduler + RNG state."""
    return f"extra_state_rank_{rank}.pt"


def rng_state() -> dict[str, Any]:
    """Every random-number generator this process uses, as tensors and plain values (a weights-only load reads it)."""
    _, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),  # (version, tuple of ints, gauss_next): plain values already
        "numpy": {
            "key": [int(word) for word in key],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (or what it captured before the numpy state became plain values:
    numpy's own tuple)."""
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        key = np.asarray(numpy_state["key"], dtype=np.uint32)
        numpy_state = (
            "MT19937",
            key,
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _legacy_numpy_globals() -> list[Any]:
    """What the numpy RNG state of checkpoints written before it became plain values needs: numpy's array
    reconstruction (under numpy 2's and numpy 1's module names), which builds arrays of numbers and calls nothing
    else, so such files still load without running anything they carry."""
    from numpy._core.multiarray import _reconstruct

    return [
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        _reconstruct,
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
    ]


def refusal_reason(error: pickle.UnpicklingError) -> str:
    """The line of torch's weights-only refusal that says what was refused (the rest is advice for torch's users)."""
    paragraphs = [part.strip() for part in str(error).split("\n\n") if part.strip()]
    boilerplate = ("Weights only load failed", "Check the documentation")
    reason = next(
        (part for part in paragraphs if not part.startswith(boilerplate)), paragraphs[-1] if paragraphs else ""
    )
    return reason.removeprefix("WeightsUnpickler error:").strip()[:300]


def load_state_file(path: Path) -> dict[str, Any]:
    """A ``.pt`` state file of a checkpoint (``trainer_state.pt``, ``extra_state_rank_<r>.pt``), read with torch's
    weights-only unpickler: tensors, numbers, strings, lists, tuples and dicts (and the numpy arrays of older
    easyr1 checkpoints' RNG state). A file that holds anything else (a pickle that would import or call something)
    is a :class:`CheckpointError` naming it, raised before any of its content runs."""
    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = refusal_reason(error)
        raise CheckpointError(
            f"{path}: refused to load: it holds more than tensors and plain values ({refused}), which easyr1 never "
            "writes there, so the file was made or altered elsewhere and could run code when loaded. Load only "
            "checkpoints you produced or trust (docs/security.md); resume from another checkpoint "
            "(trainer.load_checkpoint_path) or start without one"
        ) from None


def save_durably(obj: Any, path: Path) -> None:
    """``torch.save`` that returns only once the bytes are on disk."""
    with open(path, "wb") as file:
        torch.save(obj, file)
        file.flush()
        os.fsync(file.fileno())


def save_component(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any | None,
    model_only: bool = False,
) -> None:
    """Write this rank's part of ``model`` (and ``optimizer``, unless ``model_only``) under ``directory``.

    Collective: every rank of the model's process group must call it with the same ``directory``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # DCP's file writer fsyncs every file it writes (sync_files defaults to True).
    dcp.save(get_model_state_dict(model), checkpoint_id=str(directory / MODEL_DIR))
    if optimizer is not None and not model_only:
        dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=str(directory / OPTIMIZER_DIR))
    extra = {"rng": rng_state(), "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None}
    save_durably(extra, directory / extra_state_name(dist.get_rank() if dist.is_initialized() else 0))


def load_component(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any | None,
) -> None:
    """Load what :func:`save_component` wrote into the (already sharded) ``model``, ``optimizer`` and scheduler.

    The world size may differ from the one that saved: DCP re-shards weights and optimizer state. Each rank
    restores its own RNG state when the saving run had that rank (RNG state has no meaning across ranks).
    """
    directory = Path(directory)
    if not (directory / MODEL_DIR / ".metadata").is_file():
        raise UserError(f"{directory}: no model weights ({MODEL_DIR}/.metadata is missing); not an easyr1 checkpoint")
    # torch reads .metadata with a plain pickle.load: checked first with one that builds nothing else
    check_dcp_metadata(directory / MODEL_DIR)
    check_dcp_metadata(directory / OPTIMIZER_DIR)
    model_state = get_model_state_dict(model)
    dcp.load(model_state, checkpoint_id=str(directory / MODEL_DIR))
    set_model_state_dict(model, model_state)
    if optimizer is not None:
        if not (directory / OPTIMIZER_DIR / ".metadata").is_file():
            raise UserError(
                f"{directory} holds model weights only (saved with trainer.save_model_only=true), so training "
                "cannot resume from it; export it with scripts/model_merger.py and start a new run from the "
                "exported model (worker.actor.model.model_path)"
            )
        optimizer_state = get_optimizer_state_dict(model, optimizer)
        # A fresh optimizer gets state for every parameter, but parameters that never had a gradient (e.g. a
        # vision tower that saw only text) had none when saved; they must stay without state, or Adam's step
        # count (and so its bias correction) would differ from the uninterrupted run's.
        saved = dcp.FileSystemReader(str(directory / OPTIMIZER_DIR)).read_metadata().state_dict_metadata
        saved_params = {key.split(".", 1)[1].rsplit(".", 1)[0] for key in saved if key.startswith("state.")}
        optimizer_state["state"] = {
            name: value for name, value in optimizer_state["state"].items() if name in saved_params
        }
        dcp.load(optimizer_state, checkpoint_id=str(directory / OPTIMIZER_DIR))
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=StateDictOptions(strict=False))
    rank = dist.get_rank() if dist.is_initialized() else 0
    own = directory / extra_state_name(rank)
    extra = load_state_file(own if own.is_file() else directory / extra_state_name(0))
    if lr_scheduler is not None and extra["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if own.is_file():
        set_rng_state(extra["rng"])


def save_hf_metadata(directory: str | os.PathLike, model: nn.Module, tokenizer: Any, processor: Any | None) -> None:
    """Config, generation config, tokenizer and processor (with its chat template) under ``directory/huggingface``.

    Written by one rank; together with the sharded weights it is everything the model merger needs.
    """
    target = Path(directory) / HF_DIR
    target.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(target)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(target)
    tokenizer.save_pretrained(target)
    if processor is not None:
        processor.save_pretrained(target)
    peft_configs = getattr(model, "peft_config", None)
    if peft_configs:  # LoRA: the merger folds the adapters in with this config
        peft_configs["default"].save_pretrained(target)
    for path in target.iterdir():
        with open(path, "rb") as file:
            os.fsync(file.fileno())
