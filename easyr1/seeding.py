"""``trainer.seed``: one seed for python's, numpy's and torch's global random generators in a process.

The driver seeds itself when a run starts (``main.py``) and every hybrid worker seeds itself before it builds its
models, so anything drawn from a global generator (a value head's initialisation, a reward function's
``random.random()``) is the same in every run with the same seed. Sampling does not depend on this: each
response has its own seed (``worker.rollout.seed``, step, round, sample).
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global generator and torch's (CPU and every CUDA device) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy takes seeds in [0, 2**32)
    torch.manual_seed(seed)  # seeds the CUDA generators too
