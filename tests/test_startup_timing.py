"""``logging/startup.py``: the start-up phases add up to the total, a later run in the same process starts its own
clock, and the metrics come once per run."""

from __future__ import annotations

import time

from easyr1.logging import startup


def test_phases_add_up_to_the_total_and_come_once_per_run():
    startup.begin()
    for phase in ("imports_and_config", "workers", "first_step"):
        time.sleep(0.01)
        startup.mark(phase)
    metrics = startup.startup_metrics()
    assert list(metrics) == [
        f"timing/startup/{phase}" for phase in ("imports_and_config", "workers", "first_step")
    ] + ["timing/startup/total"]
    parts = sum(value for key, value in metrics.items() if key != "timing/startup/total")
    assert abs(parts - metrics["timing/startup/total"]) < 1e-6
    assert metrics["timing/startup/workers"] >= 0.01
    assert startup.startup_metrics() == {}  # a later step of the same run reports none
    line = startup.summary(metrics)
    assert line.startswith(f"start-up {metrics['timing/startup/total']:.1f} s") and "imports and config" in line


def test_a_later_run_in_the_same_process_times_from_its_own_start():
    startup.begin()  # the process's first run (or an earlier test's): whichever, the next begin starts from now
    startup.mark("first_step")
    startup.startup_metrics()
    time.sleep(0.05)
    startup.begin()
    startup.mark("first_step")
    assert startup.startup_metrics()["timing/startup/total"] < 0.05
