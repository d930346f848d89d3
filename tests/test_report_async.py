"""The run report's asynchronous-schedule panel: drawn from a run's ``async/`` and ``rollout_corr/by_staleness/``
metrics, absent for a synchronous run."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from easyr1.tools.report import write_report


ASYNC_PNGS = [
    "async_mismatch_gap.png",
    "async_mismatch_k3_kl.png",
    "async_span.png",
    "async_staleness.png",
    "async_tokens_per_second.png",
    "async_waiting.png",
]


def write_metrics(run_dir, records):
    """``metrics.jsonl`` as the file logger writes it: one JSON object per step."""
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def sync_step(step):
    """What every run logs, synchronous or not."""
    return {
        "step": step,
        "reward/overall": 0.1 * step,
        "timing/step": 1.0,
        "throughput/tokens_per_second": 50.0 * step,
    }


def async_step(step):
    """A partial-rollout step: samples of age 0, and from step 2 on also of age 1 (continued responses)."""
    record = {
        **sync_step(step),
        "async/staleness/mean": 0.5 if step > 1 else 0.0,
        "async/staleness/max": 1.0 if step > 1 else 0.0,
        "async/span/mean": 1.25 if step > 1 else 1.0,
        "async/span/max": 2.0 if step > 1 else 1.0,
        "async/partial_ratio": 0.25 if step > 1 else 0.0,
        "async/trainer_wait_ratio": 0.1 * step,
        "async/generator_idle_ratio": 0.05 * step,
        "rollout_corr/by_staleness/0/log_prob_gap": 0.01 * step,
        "rollout_corr/by_staleness/0/k3_kl": 0.001 * step,
    }
    if step > 1:
        record["rollout_corr/by_staleness/1/log_prob_gap"] = 0.2 + 0.05 * step
        record["rollout_corr/by_staleness/1/k3_kl"] = 0.02 + 0.005 * step
    return record


def curve_pixels(path, colour):
    """How many pixels of ``path`` are (nearly) ``colour``: the ink of one curve."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=int)
    return int((np.abs(pixels - np.array(colour)).sum(axis=-1) < 30).sum())


# matplotlib's first two colours: the first and the second curve of a plot
FIRST_CURVE, SECOND_CURVE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def test_async_panel_is_drawn_from_the_runs_async_metrics(tmp_path):
    write_metrics(tmp_path, [async_step(step) for step in (1, 2, 3, 4)])
    index = write_report(tmp_path)
    assert sorted(path.name for path in index.parent.glob("async_*.png")) == ASYNC_PNGS
    # one curve per sample age: age 0 and age 1, which starts at step 2
    gap_plot = index.parent / "async_mismatch_gap.png"
    assert curve_pixels(gap_plot, FIRST_CURVE) > 50 and curve_pixels(gap_plot, SECOND_CURVE) > 50
    page = index.read_text()
    assert "<h1>Asynchronous schedule</h1>" in page
    panel = page.split("<h1>Asynchronous schedule</h1>")[1].split("<h1>Rollouts</h1>")[0]
    assert all(f'<img src="{name}"' in panel for name in ASYNC_PNGS)
    assert '<img src="reward.png"' in page  # the main curves are still there


def test_async_panel_leaves_out_plots_without_data(tmp_path):
    """A colocated schedule logs no wait ratios and a run without samples of two ages one mismatch curve."""
    records = [async_step(step) for step in (1, 2)]
    for record in records:
        del record["async/trainer_wait_ratio"], record["async/generator_idle_ratio"]
        record.pop("rollout_corr/by_staleness/1/log_prob_gap", None)
    write_metrics(tmp_path, records)
    index = write_report(tmp_path)
    assert "async_waiting.png" not in {path.name for path in index.parent.glob("*.png")}
    gap_plot = index.parent / "async_mismatch_gap.png"
    assert curve_pixels(gap_plot, FIRST_CURVE) > 50 and curve_pixels(gap_plot, SECOND_CURVE) == 0


def test_sync_run_has_no_async_panel(tmp_path):
    write_metrics(tmp_path, [sync_step(step) for step in (1, 2, 3)])
    index = write_report(tmp_path)
    assert not list(index.parent.glob("async_*.png"))
    assert "Asynchronous schedule" not in index.read_text()
    assert (index.parent / "reward.png").is_file()
