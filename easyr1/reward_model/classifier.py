"""The classifier: a value head on a VLM or LM checkpoint, scoring prompt + response at the response's last token.

Checkpoint format: the model directory (any checkpoint :func:`~easyr1.models.loading.load_model` reads) holding
``value_head.safetensors`` beside the weights, with ``weight`` (1, hidden) and ``bias`` (1,): the critic's value
head (:class:`~easyr1.workers.critic.ValueModel`) over the backbone's last hidden state. It reads the processor's
tensors of the rollout batch, as the actor does, so it shares the policy's tokenizer and processor (checked at
start-up).
"""

from __future__ import annotations

from pathlib import Path

import torch

from easyr1.errors import ConfigError
from easyr1.protocol import Batch
from easyr1.workers.actor import forward_inputs
from easyr1.workers.critic import ValueModel


HEAD_FILE = "value_head.safetensors"


def head_path(model_path: str) -> Path:
    """Where a classifier checkpoint keeps its value head."""
    return Path(model_path) / HEAD_FILE


def load_classifier(model_path: str, dtype: torch.dtype, trust_remote_code: bool = False) -> ValueModel:
    """The checkpoint's backbone with its value head loaded (ConfigError naming the key when the head is missing or
    does not fit the backbone)."""
    from safetensors.torch import load_file

    from easyr1.models.loading import load_model

    path = head_path(model_path)
    if not path.is_file():
        raise ConfigError(
            f"worker.reward_model.model_path={model_path} has no {HEAD_FILE} (the classifier's value head: weight "
            "(1, hidden), bias (1,)); save one there or use worker.reward_model.kind=judge"
        )
    model = ValueModel(load_model(model_path, dtype, trust_remote_code=trust_remote_code))
    head = load_file(str(path))
    try:
        model.value_head.load_state_dict({key: value.to(dtype) for key, value in head.items()})
    except RuntimeError as error:
        raise ConfigError(f"worker.reward_model.model_path={model_path}: {HEAD_FILE} does not fit: {error}") from None
    return model.eval()


def save_value_head(model: ValueModel, model_path: str | Path) -> Path:
    """Write ``model``'s value head as the classifier checkpoint's ``value_head.safetensors``."""
    from safetensors.torch import save_file

    path = head_path(str(model_path))
    save_file({key: value.detach().contiguous().cpu() for key, value in model.value_head.state_dict().items()}, path)
    return path


@torch.no_grad()
def classifier_scores(model: ValueModel, batch: Batch, device: str, normalize: str) -> torch.Tensor:
    """(B,) the head's output at each sample's last response token (the last prompt token for an empty response),
    on the prompt + response with the sample's vision inputs; ``normalize=sigmoid`` maps it into (0, 1)."""
    inputs = {key: value.to(device) for key, value in forward_inputs(batch).items()}
    values = model(**inputs).float().cpu()
    prompt_length = batch["prompts"].shape[-1]
    last = prompt_length + batch["response_mask"].sum(dim=-1) - 1
    scores = values[torch.arange(len(batch)), last]
    return torch.sigmoid(scores) if normalize == "sigmoid" else scores
