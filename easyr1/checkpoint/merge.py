"""Export a checkpoint component (``global_step_N/actor``) as a Hugging Face model directory.

The sharded weights are read without any process group, LoRA adapters (if the run used them) are folded into
the base weights, and the result is saved with ``save_pretrained`` (safetensors) next to the config, generation
config, tokenizer, processor and chat template the checkpoint already holds. The export is written under a
temporary name and renamed into place, so an interrupted export never looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from easyr1.checkpoint.dcp_metadata import check_dcp_metadata
from easyr1.checkpoint.manager import PARTIAL_SUFFIX, fsync_tree
from easyr1.checkpoint.sharded import HF_DIR, MODEL_DIR
from easyr1.errors import UserError
from easyr1.models.families import family_of
from easyr1.models.loading import is_vision_language
from easyr1.models.lora import lora_scaling, merged_weights


ADAPTER_CONFIG = "adapter_config.json"
RETIRED_SUFFIX = ".replaced"
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json")


def check_component_dir(component_dir: Path) -> None:
    """A clear error unless ``component_dir`` is a committed checkpoint component with weights and HF metadata."""
    if component_dir.parent.name.endswith(PARTIAL_SUFFIX):
        raise UserError(
            f"{component_dir} belongs to a partial checkpoint ({component_dir.parent.name}: its write was "
            "interrupted); export a complete global_step_N/actor instead"
        )
    if not component_dir.is_dir():
        raise UserError(f"{component_dir} does not exist; pass a checkpoint's global_step_N/actor directory")
    if not (component_dir / MODEL_DIR / ".metadata").is_file():
        raise UserError(
            f"{component_dir} has no {MODEL_DIR}/.metadata, so it is not a complete easyr1 checkpoint component; "
            "pass the actor directory of a checkpoint step (checkpoints/<project>/<experiment>/global_step_N/actor)"
        )
    if not (component_dir / HF_DIR / "config.json").is_file():
        raise UserError(
            f"{component_dir / HF_DIR} has no config.json (the model's Hugging Face metadata); the checkpoint is "
            "incomplete or was not written by easyr1"
        )


def check_target_dir(target: Path) -> None:
    """A clear error unless ``target`` is new, empty or an earlier model export (the only folders replaced)."""
    if target.exists() and not target.is_dir():
        raise UserError(f"target {target} is a file; pass a directory for the exported model")
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise UserError(
            f"target {target} already holds files and is not a model export (no config.json); the export "
            "replaces its target folder, so pass a new or empty directory"
        )


def check_weights_fit(
    weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], component_dir: Path, config_file: Path
) -> None:
    """A clear error unless ``weights`` has exactly the names and shapes of the model built from ``config_file``."""
    missing, unexpected = sorted(expected.keys() - weights.keys()), sorted(weights.keys() - expected.keys())
    reshaped = [
        f"{name} {tuple(weights[name].shape)} vs {tuple(value.shape)}"
        for name, value in expected.items()
        if name in weights and weights[name].shape != value.shape
    ]
    if missing or unexpected or reshaped:
        raise UserError(
            f"{component_dir}: the weights do not fit the model in {config_file} (missing: {missing[:5]}, "
            f"unexpected: {unexpected[:5]}, shape (checkpoint vs config): {reshaped[:5]}); the checkpoint and "
            "its config do not belong together"
        )


def load_model_state_dict(component_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The full, unsharded weights of a component, read in this process alone (no process group)."""
    model_dir = Path(component_dir) / MODEL_DIR
    check_dcp_metadata(model_dir)  # before torch's plain pickle.load of it
    reader = dcp.FileSystemReader(str(model_dir))
    metadata = reader.read_metadata()
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def plain_weights(component_dir: Path) -> dict[str, torch.Tensor]:
    """The component's weights under Hugging Face names, LoRA adapters folded in when the run used them."""
    state = load_model_state_dict(component_dir)
    adapter_file = component_dir / HF_DIR / ADAPTER_CONFIG
    if adapter_file.is_file():
        scaling = lora_scaling(json.loads(adapter_file.read_text(encoding="utf-8")))
        return dict(merged_weights(state.items(), scaling))
    return state


def merge_to_huggingface(component_dir: str | os.PathLike, target_dir: str | os.PathLike | None = None) -> Path:
    """Write the component as a Hugging Face model into ``target_dir`` (default: ``component_dir/huggingface``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    component_dir = Path(component_dir).resolve()
    retired = component_dir / f"{HF_DIR}{RETIRED_SUFFIX}"
    if retired.is_dir() and not (component_dir / HF_DIR).exists():  # an export was killed while swapping folders
        os.rename(retired, component_dir / HF_DIR)
    check_component_dir(component_dir)
    metadata_dir = component_dir / HF_DIR
    target = Path(target_dir).resolve() if target_dir else metadata_dir
    check_target_dir(target)
    weights = plain_weights(component_dir)

    try:
        config = AutoConfig.from_pretrained(metadata_dir)
    except (OSError, ValueError) as error:
        raise UserError(f"{metadata_dir / 'config.json'} is not a valid model config: {error}") from error
    model_class = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    with torch.device("meta"):  # shapes and names only; the checkpoint's tensors are assigned below
        model = model_class.from_config(config, dtype=next(iter(weights.values())).dtype)
    check_weights_fit(weights, model.state_dict(), component_dir, metadata_dir / "config.json")
    model.load_state_dict(weights, strict=True, assign=True)

    staging = target.with_name(target.name + PARTIAL_SUFFIX)
    if staging.exists():
        shutil.rmtree(staging)
    # config, generation config, tokenizer, processor and chat template first; then the weights (and config) on top
    shutil.copytree(metadata_dir, staging, ignore=shutil.ignore_patterns(ADAPTER_CONFIG, *_WEIGHT_FILES))
    saved_generation = staging / "generation_config.json"
    generation_config = saved_generation.read_bytes() if saved_generation.exists() else None
    family_of(config).save_pretrained(model, staging)  # checkpoint names and layout (vLLM loads them)
    if generation_config is not None:  # the run's generation config, not one derived from the model config
        saved_generation.write_bytes(generation_config)
    fsync_tree(staging)
    if target.exists():
        retired = target.with_name(target.name + RETIRED_SUFFIX)
        if retired.exists():
            shutil.rmtree(retired)
        os.rename(target, retired)
        os.rename(staging, target)
        shutil.rmtree(retired)
    else:
        os.rename(staging, target)
    return target
