"""The reward function under a time limit (``worker.reward.timeout``): called in a child process that is killed when
a call runs past the limit.

Why a process: a reward function is user code, and what hangs in it is often pure python (sympy on a huge power
tower) or one long C call (a big integer power). ``SIGALRM`` interrupts only the first, and only in the main thread,
while the driver waits for the scores in a thread of its own (and the Ray reward actor runs its methods in another);
a thread cannot be stopped at all. A killed process always stops, and a fresh one takes its place for the next call.
The child is started once and kept (it imports the reward file once); a call costs the pickling of its inputs and
scores through a pipe.

A call is one 'batch' call (the whole batch) or one 'sequential' call (one sample: the child reports each score as
it finishes, so the sample that hangs is known). Past the limit, ``worker.reward.timeout_score`` null stops the run
with a :class:`~easyr1.errors.RewardError` naming the file, the function and the sample; a number scores the call's
samples with it (every sub-score) and marks them as timed out (the ``reward/timeouts`` metric).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from easyr1.errors import RewardError
from easyr1.reward.function import RewardFunction, RewardInput, RewardScore, describe_sample


TIMEOUT_KEY = "worker.reward.timeout"
TIMEOUT_SCORE_KEY = "worker.reward.timeout_score"
# Starting the child and importing the reward file is not a call: a file that imports sympy or math_verify can take
# several seconds on a busy node, longer than a tight per-call limit (math-verify's own is 5 s), so the start gets
# at least this long.
START_LIMIT_FLOOR_S = 60.0
# The folder that holds the easyr1 package: the child imports easyr1 from where this process did.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class _Timeout(Exception):
    """The child did not answer within the limit (it has been killed)."""


class _Child:
    """One child process serving the reward function, and the two pipes to it."""

    def __init__(self, reward_fn: RewardFunction) -> None:
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "easyr1.reward.child", str(to_child_read), str(from_child_write)],
            pass_fds=(to_child_read, from_child_write),
            env=env,
        )
        os.close(to_child_read)
        os.close(from_child_write)
        self.send = Connection(to_child_write, readable=False)
        self.receive = Connection(from_child_read, writable=False)
        self.send.send(reward_fn)
        self.loaded = False

    def reply(self, timeout: float) -> tuple[str, Any]:
        """The child's next message; :class:`_Timeout` (the child killed) if none comes within ``timeout`` s."""
        if not self.receive.poll(timeout):
            self.kill()
            raise _Timeout
        try:
            kind, payload = self.receive.recv()
        except EOFError:
            code = self.process.wait()
            self.kill()
            raise RewardError(
                f"the reward function's process ended (exit code {code}) while scoring; a crash in native code or "
                "a call to exit() in the reward file ends it"
            ) from None
        if kind == "error":
            raise payload
        return kind, payload

    def kill(self) -> None:
        """Stop the child now and release its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.send.close()
        self.receive.close()


class TimedRewardFunction:
    """A :class:`RewardFunction` called in a child process, each call limited to ``timeout`` seconds.

    ``reward_fn`` is the function loaded (and checked) in this process: it names the file and its settings; the
    child loads its own copy. ``timeout_score`` None: a call past the limit raises a RewardError; a number: its
    samples get that score.
    """

    def __init__(self, reward_fn: RewardFunction, timeout: float, timeout_score: float | None = None) -> None:
        self.reward_fn = reward_fn
        self.timeout = timeout
        self.timeout_score = timeout_score
        self.source = reward_fn.source
        self._known_keys: list[str] = ["overall"]
        self._child: _Child | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (TimedRewardFunction, (self.reward_fn, self.timeout, self.timeout_score))

    def close(self) -> None:
        """Stop the child process, if one runs."""
        if self._child is not None:
            self._child.kill()
            self._child = None

    def __call__(self, inputs: Sequence[RewardInput]) -> list[RewardScore]:
        """The scores of ``inputs``, as :class:`RewardFunction` gives them (timed-out samples included)."""
        return self.score_with_timeouts(inputs)[0]

    def score_with_timeouts(self, inputs: Sequence[RewardInput]) -> tuple[list[RewardScore], list[bool]]:
        """The scores of ``inputs`` and, per sample, whether its call ran past the limit (then it has the
        timeout score)."""
        inputs = list(inputs)
        if not inputs:
            return [], []
        if self.reward_fn.reward_type == "batch":
            scores: list[RewardScore | None] = self._batch(inputs)
        else:
            scores = self._sequential(inputs)
        timed_out = [score is None for score in scores]
        done = [score for score in scores if score is not None]
        if done:
            self._known_keys = list(done[0])
        filled = [
            score if score is not None else dict.fromkeys(self._known_keys, self.timeout_score) for score in scores
        ]
        self.reward_fn.check_same_keys(inputs, filled)
        return filled, timed_out

    # ------------------------------------------------------------------------------------------------ calls
    def _started_child(self) -> _Child:
        if self._child is not None and self._child.process.poll() is not None:  # ended while idle: start afresh
            self._child.kill()
            self._child = None
        if self._child is None:
            self._child = _Child(self.reward_fn)
        if not self._child.loaded:
            limit = max(self.timeout, START_LIMIT_FLOOR_S)
            try:
                self._child.reply(limit)
            except _Timeout:
                self._child = None
                raise RewardError(
                    f"importing the reward file {self.reward_fn.path} took more than {limit:g} s in the reward "
                    f"process (the larger of {TIMEOUT_KEY}={self.timeout:g} s and {START_LIMIT_FLOOR_S:g} s); make "
                    f"its import faster or raise {TIMEOUT_KEY}"
                ) from None
            except RewardError:
                self._child.kill()
                self._child = None
                raise
            self._child.loaded = True
        return self._child

    def _request(self, call_type: str, first_index: int, inputs: list[RewardInput]) -> _Child:
        child = self._started_child()
        child.send.send((call_type, first_index, inputs))
        return child

    def _reply(self, child: _Child) -> tuple[str, Any]:
        try:
            return child.reply(self.timeout)
        except _Timeout:
            self._child = None
            raise
        except RewardError:
            # an error in the reward file: the child stays usable, unless it is gone
            if child.process.poll() is not None:
                self._child = None
            raise

    def _batch(self, inputs: list[RewardInput]) -> list[RewardScore | None]:
        child = self._request("batch", 0, inputs)
        try:
            return list(self._reply(child)[1])
        except _Timeout:
            if self.timeout_score is None:
                raise RewardError(
                    f"{self.source} did not return within {TIMEOUT_KEY}={self.timeout:g} s on a batch of "
                    f"{len(inputs)} samples (REWARD_TYPE 'batch': the function sees them all at once, so the one "
                    f"that hangs is not known; the first is {describe_sample(0, inputs[0])}). Set REWARD_TYPE = "
                    f"'sequential' to find it, raise the limit, or set {TIMEOUT_SCORE_KEY} to score such calls and "
                    "go on"
                ) from None
            return [None] * len(inputs)

    def _sequential(self, inputs: list[RewardInput]) -> list[RewardScore | None]:
        scores: list[RewardScore | None] = []
        while len(scores) < len(inputs):
            first = len(scores)
            child = self._request("sequential", first, inputs[first:])
            try:
                while len(scores) < len(inputs):
                    scores.append(self._reply(child)[1])
            except _Timeout:
                index = len(scores)
                if self.timeout_score is None:
                    raise RewardError(
                        f"{self.source} did not return within {TIMEOUT_KEY}={self.timeout:g} s on "
                        f"{describe_sample(index, inputs[index])} (REWARD_TYPE 'sequential'). Make the function "
                        f"give up on such responses, raise the limit, or set {TIMEOUT_SCORE_KEY} to score them "
                        "and go on"
                    ) from None
                scores.append(None)  # the hung sample; a fresh child goes on from the next one
        return scores


def timed_reward_function(
    reward_fn: RewardFunction, timeout: float | None, timeout_score: float | None
) -> RewardFunction | TimedRewardFunction:
    """``reward_fn`` under ``worker.reward.timeout`` (as it is when the timeout is null)."""
    if timeout is None:
        return reward_fn
    return TimedRewardFunction(reward_fn, timeout, timeout_score)
