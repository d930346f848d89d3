"""Start-up checks of ``worker.reward_model``, run by ``build.read_inputs`` before anything starts: the checkpoint's
config (and a classifier's head file), that a classifier shares the policy's tokenizer, that the judge's parser
loads, and that the template renders on the first validation row (the first training row without a validation
set). Each failure is a :class:`~easyr1.errors.ConfigError` naming the key to change.
"""

from __future__ import annotations

from typing import Any

from easyr1.errors import ConfigError


def check_reward_model_inputs(config: Any, tokenizer: Any, dataset: Any) -> None:
    """Check the reward model's files against the run's tokenizer and ``dataset`` (its first row)."""
    settings = config.worker.reward_model
    if not settings.enabled:
        return
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
    from easyr1.reward_model.classifier import head_path

    key = "worker.reward_model.model_path"
    try:
        load_model_config(settings.model_path)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{key}={settings.model_path} is not a model checkpoint this run can load ({type(error).__name__}: "
            f"{error}); point it at a directory with config.json and weights"
        ) from None
    if settings.kind == "classifier":
        if not head_path(settings.model_path).is_file():
            raise ConfigError(
                f"{key}={settings.model_path} has no {head_path(settings.model_path).name} (the classifier's value "
                "head: weight (1, hidden), bias (1,)); save one there (easyr1.reward_model.classifier.save_value_head)"
            )
        own, _ = load_tokenizer_and_processor(settings.model_path)
        if own.get_vocab() != tokenizer.get_vocab():
            raise ConfigError(
                f"{key}={settings.model_path}: the classifier reads the policy's token ids, but its tokenizer differs "
                "from worker.actor.model's; use a classifier trained on the policy's tokenizer, or kind=judge"
            )
        return
    from easyr1.reward_model.client import render_requests
    from easyr1.reward_model.parser import JudgementParser
    from easyr1.reward_model.template import JudgeTemplate

    JudgementParser(settings.parser, settings.parser_words)
    template = JudgeTemplate(settings.template)
    row = dataset[0]
    reward_input = {
        "prompt": tokenizer.decode(list(row["raw_prompt_ids"]), skip_special_tokens=True),
        "response": "",
        "response_length": 0,
        "ground_truth": row["ground_truth"],
        **(row.get("row_columns") or {}),
    }
    images = len((row.get("multi_modal_data") or {}).get("images") or [])
    render_requests(template, [reward_input], [images])
