"""The child process that runs the reward function under a time limit (:mod:`easyr1.reward.timed` starts it).

``python -m easyr1.reward.child READ_FD WRITE_FD``: the first message on READ_FD is the pickled
:class:`~easyr1.reward.function.RewardFunction` (unpickling imports its file again) and the child answers
``("loaded", None)``. Then each request ``(reward_type, first_index,
inputs)`` is answered on WRITE_FD by ``("scores", [score, ...])`` for a 'batch' call, or by one ``("score",
score)`` per sample as each finishes for 'sequential' calls (so the parent knows which sample hangs), or by
``("error", RewardError)``. The child exits when the parent closes its end, and on Linux is killed when its parent
dies (a killed job leaves no reward process behind). Standard output and error are the
parent's: the reward function's prints show as before. Imports nothing heavy (no torch).
"""

from __future__ import annotations

import ctypes
import signal
import sys
from multiprocessing.connection import Connection

from easyr1.errors import RewardError, UserError


def _as_reward_error(error: BaseException, source: str) -> RewardError:
    """An error that pickles back to the parent: user errors as they are, anything else named by its type."""
    if isinstance(error, RewardError):
        return error
    if isinstance(error, UserError):
        return RewardError(str(error))
    return RewardError(f"{source} failed: {type(error).__name__}: {error}")


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (elsewhere the closed pipe ends it once it is idle)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(receive: Connection, send: Connection) -> None:
    """Load the reward function sent first, then answer scoring requests until end of input."""
    try:
        reward_fn = receive.recv()
    except BaseException as error:  # whatever importing the reward file did, the parent reports it
        send.send(("error", _as_reward_error(error, "the reward file")))
        return
    send.send(("loaded", None))
    while True:
        try:
            call_type, first_index, inputs = receive.recv()
        except EOFError:
            return
        try:
            if call_type == "batch":
                send.send(("scores", reward_fn.score_batch_call(inputs)))
            else:
                for offset, reward_input in enumerate(inputs):
                    send.send(("score", reward_fn.score_one(first_index + offset, reward_input)))
        except Exception as error:
            send.send(("error", _as_reward_error(error, reward_fn.source)))


if __name__ == "__main__":
    _die_with_parent()
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
