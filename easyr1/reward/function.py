"""Loading a user's reward function from a python file and calling it safely.

A reward file is an ordinary python module, EasyR1-compatible: ``worker.reward.reward_function`` names it as
``path/to/file.py:function`` (``compute_score`` when the function is omitted), ``REWARD_TYPE`` in the module says
how it is called and ``worker.reward.reward_function_kwargs`` are passed as keyword arguments:

* ``REWARD_TYPE = "batch"`` (the default, as in EasyR1): ``fn(list_of_inputs, **kwargs) -> list_of_scores``;
* ``REWARD_TYPE = "sequential"``: ``fn(one_input, **kwargs) -> one_score``.

Each input is a dict (:func:`easyr1.reward.inputs.build_reward_inputs`) with ``response`` (decoded text),
``response_length`` (tokens), ``ground_truth``, ``prompt`` (the prompt the model saw, chat template applied, decoded
like the response) and every other column of the sample's dataset row under its own name (``data_source``,
``extra_info``...; a column named like one of the four keys above does not replace it). Each score is a dict with
``overall`` plus any number of sub-scores (``format``, ``accuracy``...), all finite numbers and the same keys for
every sample.
Any deviation becomes a :class:`~easyr1.errors.RewardError` that names the sample and what was wrong.

With ``worker.reward_model`` each input also has ``reward_model`` (the reward model's result of the sample: score,
judge text, parsed), and a function that declares a ``reward_model`` parameter is called with a callable there that
returns the results of the inputs it is given (:mod:`easyr1.reward_model.results`).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from easyr1.errors import RewardError
from easyr1.user_code import import_user_file, names_defined_in


REWARD_TYPES = ("batch", "sequential")
DEFAULT_FUNCTION_NAME = "compute_score"
DEFAULT_REWARD_TYPE = "batch"
SPEC_KEY = "worker.reward.reward_function"
KWARGS_KEY = "worker.reward.reward_function_kwargs"
TYPE_KEY = "worker.reward.reward_type"
# The parameter through which a reward function receives the reward model's results (worker.reward_model).
REWARD_MODEL_ARGUMENT = "reward_model"

RewardInput = dict[str, Any]
RewardScore = dict[str, float]

_PREVIEW_CHARS = 200


def _preview(value: Any) -> str:
    """A short repr of a response or ground truth for error messages."""
    text = repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + f"... ({len(text)} chars)"


def describe_sample(index: int, reward_input: Mapping[str, Any]) -> str:
    """The sample at ``index`` of a call, with the start of its response and its ground truth, for messages."""
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


def _import_file(path: str) -> ModuleType:
    return import_user_file(
        path, config_key=SPEC_KEY, what="reward file", module_prefix="easyr1_reward", error=RewardError
    )


def _functions_defined_in(module: ModuleType) -> list[str]:
    return names_defined_in(module, callable)


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


def _declares(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` has a parameter called ``name`` (``**kwargs`` alone does not count: a function written before
    the argument existed is called as it always was)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
        # a function that declares `reward_model` gets the reward model's results through it (easyr1.reward_model)
        self.passed = {}
        if _declares(self.fn, REWARD_MODEL_ARGUMENT):
            from easyr1.reward_model.results import ReadRewardModel

            self.passed[REWARD_MODEL_ARGUMENT] = ReadRewardModel()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RewardFunction, (self.spec, self.kwargs, self._reward_type_override))

    def __repr__(self) -> str:
        return f"RewardFunction({self.source!r}, reward_type={self.reward_type!r}, kwargs={self.kwargs!r})"

    def __call__(self, inputs: Sequence[RewardInput]) -> list[RewardScore]:
        """Score ``inputs`` (a list of input dicts); returns one validated ``{"overall": ..., ...}`` per input."""
        inputs = list(inputs)
        if not inputs:
            return []
        if self.reward_type == "batch":
            scores = self.score_batch_call(inputs)
        else:
            scores = [self.score_one(i, reward_input) for i, reward_input in enumerate(inputs)]
        self.check_same_keys(inputs, scores)
        return scores

    def score_with_timeouts(self, inputs: Sequence[RewardInput]) -> tuple[list[RewardScore], list[bool] | None]:
        """The scores of ``inputs`` and which of them timed out: None, as this call has no time limit."""
        return self(inputs), None

    def score_batch_call(self, inputs: list[RewardInput]) -> list[RewardScore]:
        """One 'batch' call of the function on ``inputs``, each score validated."""
        raw = self._call_batch(inputs)
        return [self._validate_score(i, inputs[i], score) for i, score in enumerate(raw)]

    def score_one(self, index: int, reward_input: RewardInput) -> RewardScore:
        """One 'sequential' call of the function on the sample at ``index`` of its batch, its score validated."""
        return self._validate_score(index, reward_input, self._call_one(index, reward_input))

    def check_same_keys(self, inputs: Sequence[RewardInput], scores: Sequence[RewardScore]) -> None:
        """Every sample's score must have the keys of the first (they are logged as metrics)."""
        keys = set(scores[0])
        for i, score in enumerate(scores):
            if set(score) != keys:
                raise RewardError(
                    f"{self.source} returned score keys {sorted(score)} for {describe_sample(i, inputs[i])} but "
                    f"{sorted(keys)} for sample 0; every sample must have the same keys (they are logged as metrics)"
                )

    def _call_batch(self, inputs: list[RewardInput]) -> list[Any]:
        try:
            raw = self.fn(inputs, **self.kwargs, **self.passed)
        except Exception as error:
            raise RewardError(
                f"{self.source} raised {type(error).__name__}: {error} while scoring a batch of {len(inputs)} "
                f"samples (REWARD_TYPE 'batch'; first: {describe_sample(0, inputs[0])}). If it scores one sample "
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

    def _call_one(self, index: int, reward_input: RewardInput) -> Any:
        try:
            score = self.fn(reward_input, **self.kwargs, **self.passed)
        except Exception as error:
            raise RewardError(
                f"{self.source} raised {type(error).__name__}: {error} on {describe_sample(index, reward_input)}"
                " (REWARD_TYPE 'sequential': it is called with one input dict)"
            ) from error
        if isinstance(score, list | tuple):
            raise RewardError(
                f"{self.source} returned a {type(score).__name__} for {describe_sample(index, reward_input)}; a "
                "'sequential' reward function returns one score dict. If it takes the whole list, set "
                f"REWARD_TYPE = 'batch' in the file or `{TYPE_KEY}=batch`."
            )
        return score

    def _validate_score(self, index: int, reward_input: RewardInput, score: Any) -> RewardScore:
        where = f"{self.source} on {describe_sample(index, reward_input)}"
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
                # .item(): a one-element tensor or numpy scalar (the reward process need not import torch)
                number = float(value.item() if hasattr(value, "item") else value)
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
