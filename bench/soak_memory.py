"""Memory soak: does easyr1's host memory grow over a long run?

Trains the small peer-benchmark model (``bench/peer_bench.py``'s workload: 4 prompts x 8 samples x 32 tokens)
for ``--steps`` steps and reads, per step, the peak resident memory easyr1 itself logs in ``metrics.jsonl``:
``perf/driver_max_host_memory_gb`` (the driver) and ``perf/max_host_memory_gb`` (the workers' mean). Both are
``VmHWM`` reset after every step, so each step's value is that step's own peak. The script also samples the summed
RSS of the whole process tree (driver, Ray, workers, vLLM) every 0.2 s and keeps each step's last sample. It fits a
least-squares line over steps ``--fit-from``..end for each series and prints its slope in MB per 100 steps beside
the spread of the residuals; a slope whose total change over the fitted steps stays inside twice the residual
standard deviation is reported as within noise. A line fit calls a series that is flat apart from one rise (an
allocator taking a new arena) growing, so each series is fitted again with its largest single rise taken out: "flat"
when what is left grows by less than ``--tolerance`` MB / 100 steps or within twice its residual spread, "still
grows" otherwise. ``--analyse`` re-fits a saved result (another ``--fit-from``, another tolerance) without a run.

    python bench/soak_memory.py [--steps 200] [--workers 1] [--easyr1-set KEY=VALUE ...]
    python bench/soak_memory.py --analyse bench/results/soak-<time>.json [--fit-from 300]
    python bench/soak_memory.py --analyse-metrics /tmp/soak_<id>/metrics.jsonl [--fit-from 50]   # a run cut short
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil


sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import EASYR1_SETTINGS, REPO, RESULTS, THREADS, TreeRss, ensure_assets, run_env  # noqa: E402


# the series easyr1 logs itself, by name: each step's peak resident memory
SERIES_KEYS = {
    "driver peak RSS (perf/driver_max_host_memory_gb)": "perf/driver_max_host_memory_gb",
    "worker peak RSS (perf/max_host_memory_gb, mean)": "perf/max_host_memory_gb",
}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope and intercept of ``ys`` over ``xs``, and the residuals' standard deviation."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    intercept = mean_y - slope * mean_x
    residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys)]
    return slope, intercept, statistics.pstdev(residuals)


def without_largest_rise(xs: list[float], ys: list[float]) -> tuple[int, float, list[float]]:
    """The largest rise between consecutive points (its index, its size) and ``ys`` with it taken out: every point
    after it lowered by that much. A series that is flat apart from one such rise (an allocator taking a new arena)
    is then flat; one that grows step by step still grows."""
    rises = [ys[i + 1] - ys[i] for i in range(len(ys) - 1)]
    at = max(range(len(rises)), key=rises.__getitem__)
    size = max(rises[at], 0.0)
    return at + 1, size, [y - size if i > at else y for i, y in enumerate(ys)]


def analyse(
    series: dict[str, dict[int, float]], fit_from: int, last_step: int, tolerance: float = 0.1
) -> dict[str, dict[str, float | str]]:
    """Fit each series (GB per step) over ``fit_from``..``last_step``, print the slopes, with and without the
    series' largest single rise; the summary per series."""
    print(f"least-squares fit over steps {fit_from}-{last_step}:")
    summary: dict[str, dict[str, float | str]] = {}
    for name, values in series.items():
        points = sorted((int(s), v) for s, v in values.items() if fit_from <= int(s) <= last_step)
        if len(points) < 3:
            print(f"  {name}: too few points")
            continue
        xs, ys = [float(s) for s, _ in points], [v * 1000 for _, v in points]  # MB
        slope, intercept, noise = fit_line(xs, ys)
        change = slope * (xs[-1] - xs[0])
        verdict = "within noise" if abs(change) <= 2 * noise else "GROWS" if change > 0 else "shrinks"
        print(
            f"  {name}: {slope * 100:+.2f} MB / 100 steps (start {intercept + slope * xs[0]:.0f} MB, "
            f"residual sd {noise:.1f} MB, change over the fit {change:+.1f} MB): {verdict}"
        )
        at, rise, flattened = without_largest_rise(xs, ys)
        rest_slope, _, rest_noise = fit_line(xs, flattened)
        rest_change = rest_slope * (xs[-1] - xs[0])
        # a rise that is the whole growth is a step, not a leak: nothing grows on either side of it. Growth slower
        # than ``tolerance`` MB / 100 steps (0.1: 1 MB in 1000 steps) counts as flat even when the series is smooth
        # enough for a line fit to tell it from zero.
        grows = rest_slope * 100 > tolerance and rest_change > 2 * rest_noise
        rest_verdict = "still grows" if grows else "flat"
        print(
            f"    without its largest single rise (+{rise:.1f} MB at step {int(xs[at])}): "
            f"{rest_slope * 100:+.2f} MB / 100 steps (change over the fit {rest_change:+.1f} MB): {rest_verdict}"
        )
        summary[name] = {
            "slope_mb_per_100_steps": slope * 100,
            "residual_sd_mb": noise,
            "verdict": verdict,
            "largest_rise_mb": rise,
            "largest_rise_step": int(xs[at]),
            "slope_without_it_mb_per_100_steps": rest_slope * 100,
            "verdict_without_it": rest_verdict,
        }
    return summary


def tree_rss_gb(pid: int) -> float:
    """Summed RSS of ``pid`` and its descendants now, in GB."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total / 1e9


def main() -> None:
    """Run easyr1 for many steps, fit the memory lines, print the slopes."""
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--fit-from", type=int, default=20, help="first step of the fit (start-up growth before)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--size", default="0.6M")
    parser.add_argument("--easyr1-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.1,
        help="MB / 100 steps below which a series without its largest rise is flat",
    )
    parser.add_argument("--analyse", metavar="SOAK_JSON", help="re-fit a saved soak-<time>.json instead of running")
    parser.add_argument(
        "--analyse-metrics",
        metavar="METRICS_JSONL",
        help="fit the driver and worker series of a run's metrics.jsonl (a soak stopped before its end: no tree RSS)",
    )
    args = parser.parse_args()
    if args.analyse_metrics:
        lines = Path(args.analyse_metrics).read_text().splitlines()
        records = [r for r in (json.loads(line) for line in lines if line.strip()) if "timing/step" in r]
        series = {name: {int(r["step"]): r[key] for r in records if key in r} for name, key in SERIES_KEYS.items()}
        print(f"{len(records)} steps, median {statistics.median(r['timing/step'] for r in records):.2f} s/step")
        analyse(series, args.fit_from, max(int(r["step"]) for r in records), args.tolerance)
        return
    if args.analyse:
        saved = json.loads(Path(args.analyse).read_text())
        last = max(int(step) for values in saved["series"].values() for step in values)
        analyse(saved["series"], args.fit_from, last, args.tolerance)
        return
    if args.fit_from >= args.steps - 2:
        raise SystemExit(f"--fit-from ({args.fit_from}) must leave at least 3 steps before --steps ({args.steps})")

    models, data = ensure_assets([args.size])
    work = Path(tempfile.mkdtemp(prefix="soak_"))
    settings = {
        **EASYR1_SETTINGS,
        "data.train_files": str(data / "train.jsonl"),
        "data.val_files": str(data / "val.jsonl"),
        "worker.actor.model.model_path": str(models[args.size]),
        "trainer.n_gpus_per_node": args.workers,
        "trainer.max_steps": args.steps,
        "trainer.total_epochs": 1000,  # the dataset holds 64 batches; the soak runs over several epochs
        "trainer.save_checkpoint_path": str(work),
        "trainer.log_dir": str(work),
    }
    command = [sys.executable, "-m", "easyr1.main", "config=examples/config_cpu.yaml"]
    command += [f"{key}={value}" for key, value in settings.items()] + args.easyr1_set
    metrics_file = work / "metrics.jsonl"
    tree_by_step: dict[int, float] = {}
    with (work / "run.log").open("w") as log:
        process = subprocess.Popen(command, env=run_env(THREADS), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        peak = TreeRss(process.pid)
        seen = 0
        while process.poll() is None:
            lines = metrics_file.read_text().splitlines() if metrics_file.exists() else []
            now = tree_rss_gb(process.pid)
            for line in lines[seen:]:
                record = json.loads(line)
                if "timing/step" in record:
                    tree_by_step[int(record["step"])] = now
            seen = len(lines)
            time.sleep(0.2)
        tree_peak, tree_pss_peak = peak.stop()
    if process.returncode:
        raise SystemExit(f"easyr1 exited with {process.returncode}; log: {work / 'run.log'}")

    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    records = [r for r in records if "timing/step" in r]
    series = {name: {int(r["step"]): r[key] for r in records if key in r} for name, key in SERIES_KEYS.items()}
    series["process tree RSS (sampled at each step's log line)"] = tree_by_step
    step_times = [r["timing/step"] for r in records]
    print(
        f"{len(records)} steps, median {statistics.median(step_times):.2f} s/step, tree peak RSS {tree_peak:.2f} GB, "
        f"peak PSS {tree_pss_peak:.2f} GB"
    )
    summary = analyse(series, args.fit_from, args.steps, args.tolerance)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "summary": summary, "series": series}, indent=1))
    print(f"raw numbers: {out}")


if __name__ == "__main__":
    main()
