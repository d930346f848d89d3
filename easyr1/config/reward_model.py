"""The ``worker.reward_model`` section: a reward model that scores responses with the images in view, with its checks.

``kind`` picks it: null (none), ``classifier`` (a value head on a VLM or LM checkpoint: its output at the response's
last token) or ``judge`` (a VLM that writes a judgement from a Jinja template, turned into a score by a parser). It
runs on the hybrid workers after generation and before the reward function (``easyr1/reward_model/``;
docs/reward_models.md says how each key maps to verl's ``reward_model.*`` keys).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from easyr1.config.fields import option
from easyr1.config.paths import resolve_function, resolve_path
from easyr1.config.rules import AT_LEAST_ONE, NON_NEGATIVE, OPEN_UNIT, one_of


REWARD_MODEL_KINDS = ("classifier", "judge")
NORMALIZATIONS = ("none", "sigmoid")
REWARD_MODEL_ENGINES = ("vllm", "hf")
REWARD_MODEL_PLACEMENTS = ("colocated", "standalone")
# The first number in the judgement: the parser when none is given.
DEFAULT_PARSER = r"(-?\d+(?:\.\d+)?)"
# The reward function of a run with a reward model and no reward file: the reward model's score is the reward.
BUILTIN_REWARD_FUNCTION = (
    str(Path(__file__).resolve().parent.parent / "reward_model" / "as_reward.py") + ":compute_score"
)


@dataclass
class RewardModelConfig:
    """A reward model (classifier) or generative judge that scores each response, images included."""

    kind: str | None = option(None, "null (no reward model), classifier (a value head) or judge (a generative VLM)")
    model_path: str | None = option(
        None,
        "the reward model's checkpoint directory (a classifier's also holds value_head.safetensors: weight (1, "
        "hidden), bias (1,))",
    )
    template: str | None = option(
        None,
        "judge: a Jinja file rendering the judge's request from prompt, images (one image placeholder each), "
        "response and ground_truth",
    )
    parser: str = option(
        DEFAULT_PARSER,
        "judge: a regex with one group (a number, or a word looked up in parser_words) searched in the judgement, "
        "or 'path/to/file.py:function' taking the text and returning a float or None (unparseable)",
    )
    parser_words: dict[str, float] = option({}, "judge: a word the parser's group may capture -> its score")
    unparseable_score: float = option(
        0.0, "judge: the score of a judgement the parser cannot read (counted in reward_model/unparseable)"
    )
    temperature: float = option(0.0, "judge: sampling temperature (0: greedy, deterministic)")
    seed: int = option(0, "judge: sampling seed (the same for every request, so a judgement is reproducible)")
    max_tokens: int = option(64, "judge: most tokens of a judgement")
    normalize: str = option("none", "classifier: none (the head's output) or sigmoid (mapped into (0, 1))")
    engine: str | None = option(None, "judge: vllm or hf (null: worker.rollout.name)")
    micro_batch_size: int = option(8, "samples per forward (classifier) or per generate call (hf judge)")
    gpu_memory_utilization: float = option(
        0.2, "judge on vLLM: fraction of GPU memory its engine may use (beside worker.rollout.gpu_memory_utilization)"
    )
    max_model_len: int = option(2048, "judge on vLLM: longest request + judgement it handles")
    cpu_kv_cache_gb: float = option(0.25, "judge on vLLM on CPU: GiB of its KV cache")
    placement: str = option(
        "colocated",
        "colocated (on the hybrid workers, asleep while the policy generates and trains) or standalone (workers of "
        "its own, each with a device, scoring while the policy computes its log-probs)",
    )
    num_workers: int = option(
        1, "standalone: how many reward model workers, each with a device of its own (one node), beside the trainer's"
    )

    @property
    def enabled(self) -> bool:
        """Whether a reward model scores the responses."""
        return self.kind is not None

    @property
    def colocated(self) -> bool:
        """Whether a reward model scores on the hybrid workers."""
        return self.enabled and self.placement == "colocated"

    @property
    def standalone(self) -> bool:
        """Whether a reward model scores on workers of its own."""
        return self.enabled and self.placement == "standalone"


# Value rules of single keys, relative to ``worker.reward_model``.
REWARD_MODEL_RANGES = {
    "unparseable_score": (lambda v: math.isfinite(v), "a finite number"),
    "temperature": (lambda v: v >= 0, "0 (greedy) or more"),
    "max_tokens": AT_LEAST_ONE,
    "micro_batch_size": AT_LEAST_ONE,
    "gpu_memory_utilization": OPEN_UNIT,
    "max_model_len": AT_LEAST_ONE,
    "cpu_kv_cache_gb": (lambda v: v > 0, "positive"),
    "seed": NON_NEGATIVE,
    "num_workers": AT_LEAST_ONE,
}


def judge_engine(config: Any) -> str:
    """The judge's engine: ``worker.reward_model.engine``, else the rollout's."""
    return config.worker.reward_model.engine or config.worker.rollout.name


def fill_reward_model_paths(config: Any) -> None:
    """Absolute local paths; a run with a reward model and no reward file scores with the reward model alone."""
    reward_model, reward = config.worker.reward_model, config.worker.reward
    reward_model.model_path = resolve_path(reward_model.model_path)
    reward_model.template = resolve_path(reward_model.template)
    if reward_model.parser.endswith(".py") or re.search(r"\.py:\w+$", reward_model.parser):
        reward_model.parser = resolve_function(reward_model.parser)
    if reward_model.enabled and reward.reward_function is None and reward.reward_function_name is None:
        reward.reward_function = BUILTIN_REWARD_FUNCTION


def check_reward_model(config: Any, problems: list[str]) -> None:
    """Names, the keys each kind needs, and the parser (compiled, or its file present)."""
    section = config.worker.reward_model
    if section.kind is None:
        return
    one_of(problems, "worker.reward_model.kind", section.kind, REWARD_MODEL_KINDS)
    one_of(problems, "worker.reward_model.normalize", section.normalize, NORMALIZATIONS)
    one_of(problems, "worker.reward_model.placement", section.placement, REWARD_MODEL_PLACEMENTS)
    if section.placement == "standalone" and config.trainer.single_process:
        problems.append(
            "worker.reward_model.placement=standalone runs the reward model in Ray workers of its own; "
            "trainer.single_process=true has none: set worker.reward_model.placement=colocated"
        )
    if section.placement == "colocated" and config.async_training.placement == "split":
        problems.append(
            "async_training.placement=split: the generators hold the engine alone and the trainers no engine, so "
            "neither can host worker.reward_model; set worker.reward_model.placement=standalone"
        )
    if section.engine is not None:
        one_of(problems, "worker.reward_model.engine", section.engine, REWARD_MODEL_ENGINES)
    if section.model_path is None:
        problems.append(
            f"worker.reward_model.kind={section.kind} needs worker.reward_model.model_path (the reward model's "
            "checkpoint directory)"
        )
    if config.env.enabled:
        problems.append("worker.reward_model scores single-turn responses; an agent run (env) cannot use it yet")
    if section.kind != "judge":
        return
    if section.template is None:
        problems.append("worker.reward_model.kind=judge needs worker.reward_model.template (a Jinja file)")
    elif not Path(section.template).is_file():
        problems.append(f"worker.reward_model.template={section.template} does not exist; give a Jinja file")
    parser_problem(section.parser, problems)


def parser_problem(parser: str, problems: list[str]) -> None:
    """A regex parser must compile with exactly one group; a file parser's file must exist."""
    path, colon, name = parser.rpartition(":")
    if colon and path.endswith(".py") and name.isidentifier():
        if not Path(path).is_file():
            problems.append(f"worker.reward_model.parser={parser!r}: the file {path} does not exist")
        return
    try:
        groups = re.compile(parser).groups
    except re.error as error:
        problems.append(f"worker.reward_model.parser={parser!r} is not a valid regex ({error}); fix it")
        return
    if groups != 1:
        problems.append(
            f"worker.reward_model.parser={parser!r} has {groups} groups; it needs exactly one, the score (a number "
            "or a word in worker.reward_model.parser_words), or 'path/to/file.py:function'"
        )
