"""The local Ray cluster ``easyr1.main.init_ray`` starts: the system settings it gets (read back from Ray)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

from easyr1.main import TASK_EVENTS_KEPT


pytestmark = pytest.mark.ray


READ_BACK = (
    "import ray\n"
    "from easyr1.main import init_ray\n"
    "init_ray(1)\n"
    "print('task events kept', ray._raylet.Config.task_events_max_num_task_in_gcs())\n"
    "ray.shutdown()\n"
)


def task_events_kept(extra_env: dict[str, str]) -> int:
    """Start the cluster in a fresh process (this one may already hold a Ray instance); the limit its GCS got."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_task_events_max_num_task_in_gcs")}
    env.update(PYTHONPATH=str(REPO), **extra_env)
    result = subprocess.run(
        [sys.executable, "-c", READ_BACK], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("task events kept"))
    return int(line.split()[-1])


@pytest.mark.parametrize(
    "extra_env, expected",
    [
        # Ray's default (100,000 tasks, ~3.4 KB each) grew GCS by ~17 KB a training step
        ({}, TASK_EVENTS_KEPT),
        # a user who wants more history exports Ray's own variable, and gets it
        ({"RAY_task_events_max_num_task_in_gcs": "12345"}, 12345),
    ],
)
def test_gcs_keeps_a_bounded_number_of_task_events(extra_env, expected):
    assert task_events_kept(extra_env) == expected
