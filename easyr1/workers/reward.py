"""Loading a user's reward function from a python file and calling it safely.

A reward file is an ordinary python module, EasyR1-compatible: ``worker.reward.reward_function`` names it as
``path/to/file.py:function`` (``compute_score`` when the function is omitted), ``REWARD_TYPE`` in the module says
how it is called and ``worker.reward.reward_function_kwargs`` are passed as keyword arguments:

* ``REWARD_TYPE = "batch"`` (the default, as in EasyR1): ``fn(list_of_inputs, **kwargs) -> list_of_scores``;
* ``REWARD_TYPE = "sequential"``: ``fn(one_input, **kwargs) -> one_score``.

Each input is a dict with ``response`` (decoded text), ``response_length`` (tokens), ``ground_truth`` and, where the
caller has them, ``prompt`` and other per-sample fields (``data_source``...). Each score is a dict with ``overall``
plus any number of sub-scores (``format``, ``accuracy``...), all finite numbers and the same keys for every sample.
Any deviation becomes a :class:`~easyr1.errors.RewardError` that names the sample and what was wrong.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from easyr1.errors import RewardError


REWARD_TYPES = ("batch", "sequential")
DEFAULT_FUNCTION_NAME = "compute_score"
DEFAULT_REWARD_TYPE = "batch"
SPEC_KEY = "worker.reward.reward_function"
KWARGS_KEY = "worker.reward.reward_function_kwargs"
TYPE_KEY = "worker.reward.reward_type"

RewardInput = dict[str, Any]
RewardScore = dict[str, float]

_PREVIEW_CHARS = 200


def _preview(value: Any) -> str:
    """A short repr of a response or ground truth for error messages."""
    text = repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + f"... ({len(text)} chars)"


def _describe_sample(index: int, reward_input: Mapping[str, Any]) -> str:
    response = reward_input.get("response") if isinstance(reward_input, Mapping) else reward_input
    ground_truth = reward_input.get("ground_truth") if isinstance(reward_input, Mapping) else None
    return f"sample {index} (response {_preview(response)}, ground truth {_preview(ground_truth)})"


def parse_reward_spec(spec: str) -> tuple[str, str]:
    """Split ``path/to/file.py[:function]`` into (path, function name), defaulting to ``compute_score``."""
    if not isinstance(spec, str) or not spec.strip():
        raise RewardError(f"`{SPEC_KEY}` must be a string like 'path/to/file.py:compute_score', got {spec!r}")
    spec = spec.strip()
    path, sep, function_name = spec.rpartition(":")
    # No colon, or a colon that belongs to the path (a Windows drive, a directory name): the whole spec is a path.
    if not sep or "/" in function_name or "\\" in function_name or function_name.endswith(".py"):
        return spec, DEFAULT_FUNCTION_NAME
    if not function_name.isidentifier():
        raise RewardError(
            f"`{SPEC_KEY}` = {spec!r}: {function_name!r} after the ':' is not a python function name; "
            "use 'path/to/file.py:function_name'"
        )
    return path, function_name


def _module_name_for(path: str) -> str:
    # Unique per file, so two reward files both called math.py do not replace each other (or the stdlib math).
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    return f"easyr1_reward_{stem}_{digest}"


def _import_file(path: str) -> ModuleType:
    module_name = _module_name_for(path)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"`{SPEC_KEY}`: cannot import {path!r} as python code; point it at a .py file")
    module = importlib.util.module_from_spec(module_spec)
    # The file's directory goes on sys.path so that it can import helper modules that sit next to it. Appended,
    # not prepended: reward files named like the stdlib (math.py) must not shadow it for the rest of the process.
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.append(directory)
    sys.modules[module_name] = module  # registered before exec: dataclasses and pickling look it up
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise RewardError(
            f"Importing the reward file {path} (`{SPEC_KEY}`) failed with {type(error).__name__}: {error}"
        ) from error
    return module


def _functions_defined_in(module: ModuleType) -> list[str]:
    return sorted(
        name
        for name, value in vars(module).items()
        if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    )


def _check_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any], source: str) -> None:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(kwargs) - set(accepted[1:]))
    if unknown:
        raise RewardError(
            f"`{KWARGS_KEY}` has {unknown}, which {source} does not accept; "
            f"its keyword parameters are {accepted[1:] or 'none'}"
        )


class RewardFunction:
    """A loaded reward function: call it with a list of reward inputs, get a validated list of score dicts.

    Pickling stores the spec, not the function, and re-imports the file on load, so the object can be shipped to
    Ray workers even though the module was imported under a private name.
    """

    def __init__(
        self,
        spec: str,
        kwargs: Mapping[str, Any] | None = None,
        reward_type: str | None = None,
    ) -> None:
        self.spec = spec
        self.path, self.function_name = parse_reward_spec(spec)
        self.kwargs = dict(kwargs or {})
        self._reward_type_override = reward_type
        self.source = f"{self.path}:{self.function_name}"

        resolved = os.path.abspath(os.path.expanduser(self.path))
        if not os.path.isfile(resolved):
            raise RewardError(
                f"Reward function file {self.path!r} (from `{SPEC_KEY}`) does not exist (looked for {resolved}). "
                "Give the path of a python file, relative to the working directory or absolute, as "
                "'path/to/file.py:function_name'."
            )
        self.module = _import_file(resolved)

        fn = getattr(self.module, self.function_name, None)
        if fn is None or not callable(fn):
            available = _functions_defined_in(self.module)
            what = "is not callable" if fn is not None else "is not defined"
            raise RewardError(
                f"`{SPEC_KEY}`: {self.function_name!r} {what} in {self.path}. "
                f"Functions defined there: {', '.join(available) or 'none'}. "
                f"Name one after the colon: '{self.path}:<function>'."
            )
        self.fn: Callable[..., Any] = fn

        if reward_type is not None:
            if reward_type not in REWARD_TYPES:
                raise RewardError(f"`{TYPE_KEY}` must be one of {REWARD_TYPES} or null, got {reward_type!r}")
            self.reward_type = reward_type
        else:
            declared = getattr(self.module, "REWARD_TYPE", DEFAULT_REWARD_TYPE)
            if declared not in REWARD_TYPES:
                raise RewardError(
                    f"REWARD_TYPE = {declared!r} in {self.path} is not valid; set it to 'batch' (a list of inputs "
                    "-> a list of score dicts) or 'sequential' (one input -> one score dict)"
                )
            self.reward_type = declared
        self.name = str(getattr(self.module, "REWARD_NAME", self.function_name))
        _check_kwargs(self.fn, self.kwargs, self.source)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RewardFunction, (self.spec, self.kwargs, self._reward_type_override))

    def __repr__(self) -> str:
        return f"RewardFunction({self.source!r}, reward_type={self.reward_type!r}, kwargs={self.kwargs!r})"

    def __call__(self, inputs: Sequence[RewardInput]) -> list[RewardScore]:
        """Score ``inputs`` (a list of input dicts); returns one validated ``{"overall": ..., ...}`` per input."""
        inputs = list(inputs)
        if not inputs:
            return []
        raw = self._call_batch(inputs) if self.reward_type == "batch" else self._call_sequential(inputs)
        scores = [self._validate_score(i, inputs[i], score) for i, score in enumerate(raw)]
        keys = set(scores[0])
        for i, score in enumerate(scores):
            if set(score) != keys:
                raise RewardError(
                    f"{self.source} returned score keys {sorted(score)} for {_describe_sample(i, inputs[i])} but "
                    f"{sorted(keys)} for sample 0; every sample must have the same keys (they are logged as metrics)"
                )
        return scores

    def _call_batch(self, inputs: list[RewardInput]) -> list[Any]:
        try:
            raw = self.fn(inputs, **self.kwargs)
        except Exception as error:
            raise RewardError(
                f"{self.source} raised {type(error).__name__}: {error} while scoring a batch of {len(inputs)} "
                f"samples (REWARD_TYPE 'batch'; first: {_describe_sample(0, inputs[0])}). If it scores one sample "
                f"at a time, set REWARD_TYPE = 'sequential' in the file or `{TYPE_KEY}=sequential`."
            ) from error
        if isinstance(raw, Mapping) or not isinstance(raw, Sequence) or isinstance(raw, str):
            raise RewardError(
                f"{self.source} returned {type(raw).__name__} for a batch of {len(inputs)} samples; a 'batch' "
                "reward function must return a list with one score dict per input. If it scores one sample at "
                f"a time, set REWARD_TYPE = 'sequential' in the file or `{TYPE_KEY}=sequential`."
            )
        if len(raw) != len(inputs):
            raise RewardError(
                f"{self.source} returned {len(raw)} scores for a batch of {len(inputs)} samples; "
                "it must return exactly one score dict per input, in order"
            )
        return list(raw)

    def _call_sequential(self, inputs: list[RewardInput]) -> list[Any]:
        raw = []
        for i, reward_input in enumerate(inputs):
            try:
                score = self.fn(reward_input, **self.kwargs)
            except Exception as error:
                raise RewardError(
                    f"{self.source} raised {type(error).__name__}: {error} on {_describe_sample(i, reward_input)}"
                    " (REWARD_TYPE 'sequential': it is called with one input dict)"
                ) from error
            if isinstance(score, list | tuple):
                raise RewardError(
                    f"{self.source} returned a {type(score).__name__} for {_describe_sample(i, reward_input)}; a "
                    "'sequential' reward function returns one score dict. If it takes the whole list, set "
                    f"REWARD_TYPE = 'batch' in the file or `{TYPE_KEY}=batch`."
                )
            raw.append(score)
        return raw

    def _validate_score(self, index: int, reward_input: RewardInput, score: Any) -> RewardScore:
        where = f"{self.source} on {_describe_sample(index, reward_input)}"
        if not isinstance(score, Mapping):
            raise RewardError(
                f"{where} returned {type(score).__name__} {_preview(score)}; expected a dict like "
                "{'overall': 1.0, 'accuracy': 1.0}"
            )
        if "overall" not in score:
            raise RewardError(
                f"{where} returned keys {sorted(map(str, score))} without 'overall' (the reward "
                "used for training); add it"
            )
        validated: RewardScore = {}
        for key, value in score.items():
            if isinstance(value, str | bytes) or value is None:
                raise RewardError(f"{where}: score {key!r} is {_preview(value)}; every score must be a number")
            try:
                number = float(value.item() if isinstance(value, torch.Tensor) else value)
            except (TypeError, ValueError, RuntimeError) as error:
                raise RewardError(
                    f"{where}: score {key!r} = {_preview(value)} is not a number ({type(value).__name__})"
                ) from error
            if not math.isfinite(number):
                raise RewardError(f"{where}: score {key!r} is {number}; every score must be finite")
            validated[str(key)] = number
        return validated


def load_reward_function(
    spec: str, kwargs: Mapping[str, Any] | None = None, reward_type: str | None = None
) -> RewardFunction:
    """Load ``path/to/file.py[:function]`` as a :class:`RewardFunction`.

    Args:
        spec: the file and function (``compute_score`` when omitted), from ``worker.reward.reward_function``.
        kwargs: extra keyword arguments for every call, from ``worker.reward.reward_function_kwargs``.
        reward_type: ``"batch"`` or ``"sequential"`` to override the module's ``REWARD_TYPE`` (default
            ``"batch"``); ``None`` keeps the module's choice.

    Raises:
        RewardError: missing file, import failure, missing function, bad REWARD_TYPE or unknown kwargs.
    """
    return RewardFunction(spec, kwargs, reward_type)


def make_reward_inputs(
    responses: Sequence[str],
    response_lengths: Sequence[int] | torch.Tensor,
    ground_truths: Sequence[Any],
    prompts: Sequence[str] | None = None,
    extra_fields: Mapping[str, Sequence[Any]] | None = None,
) -> list[RewardInput]:
    """Assemble one input dict per sample (``response``, ``response_length``, ``ground_truth``, [``prompt``], extras).

    Args:
        responses: (B,) decoded responses.
        response_lengths: (B,) number of response tokens.
        ground_truths: (B,) ground truth of each sample.
        prompts: (B,) decoded prompts, if the reward needs them.
        extra_fields: more per-sample fields by name (e.g. ``data_source``), each of length B.
    """
    lengths = response_lengths.tolist() if isinstance(response_lengths, torch.Tensor) else list(response_lengths)
    columns: dict[str, Sequence[Any]] = {
        "response": responses,
        "response_length": lengths,
        "ground_truth": ground_truths,
    }
    if prompts is not None:
        columns["prompt"] = prompts
    columns.update(extra_fields or {})
    sizes = {key: len(values) for key, values in columns.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"reward input fields disagree on the number of samples: {sizes}")
    return [
        {key: (int(values[i]) if key == "response_length" else values[i]) for key, values in columns.items()}
        for i in range(len(responses))
    ]


def compute_rewards(
    reward_fn: RewardFunction,
    responses: Sequence[str],
    response_lengths: Sequence[int] | torch.Tensor,
    ground_truths: Sequence[Any],
    prompts: Sequence[str] | None = None,
    extra_fields: Mapping[str, Sequence[Any]] | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Score a batch of responses.

    Returns:
        (scores (B,) float32 tensor of ``overall``, every score key -> list of B floats, ``overall`` included).
        The trainer puts each score on the sample's last valid response token.
    """
    inputs = make_reward_inputs(responses, response_lengths, ground_truths, prompts, extra_fields)
    scores = reward_fn(inputs)
    overall = torch.tensor([score["overall"] for score in scores], dtype=torch.float32)
    keys = list(scores[0]) if scores else ["overall"]
    return overall, {key: [score[key] for score in scores] for key in keys}
