"""The judge demo's acceptance: ``python -m easyr1.tools.demo --judge`` on seeds 1, 2 and 3 and the image-blind control
(``--shuffle-images``) on the same seeds, one run after another; the rule accuracy's rise of each and whether every
judged run rose by at least ``--bar`` while no control did.

``PYTHONPATH=$PWD .venv/bin/python bench/demo_judge_seeds.py [--seeds 1 2 3] [--no-control] [-- key=value ...]``
(``make bench-demo-judge``). Each run prints its own ``demo-judge`` line; this script collects them into one table
with the machine's load average at each run's start (the runs' seconds are comparable only at similar loads).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys


LINE = re.compile(
    r"^(demo-judge(?:-control)?): accuracy_first=(\S+) accuracy_last=(\S+) judge_accuracy=(\S+) "
    r"steps=(\d+) seconds=(\d+)$",
    re.MULTILINE,
)


def run_demo(seed: int, control: bool, overrides: list[str]) -> dict[str, float] | None:
    """One demo run; its demo-judge numbers (None when it printed no line)."""
    command = [sys.executable, "-m", "easyr1.tools.demo", "--judge", "--seed", str(seed)]
    command += ["--shuffle-images"] if control else []
    load = os.getloadavg()[0]
    result = subprocess.run([*command, *overrides], capture_output=True, text=True, check=False)
    match = LINE.search(result.stdout)
    if match is None:
        print(f"seed {seed}{' control' if control else ''}: no demo-judge line (exit {result.returncode})")
        print(result.stderr[-3000:])
        return None
    print(match.group(0), f"(load {load:.1f})", flush=True)
    first, last, judge, steps, seconds = (float(value) for value in match.groups()[1:])
    return {"first": first, "last": last, "rise": last - first, "judge": judge, "steps": steps, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    """Run the seeds (and their controls) in turn and print the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="demo seeds")
    parser.add_argument("--no-control", action="store_true", help="skip the --shuffle-images runs")
    parser.add_argument("--bar", type=float, default=0.3, help="the rule accuracy's least rise of a judged run")
    parser.add_argument("overrides", nargs="*", help="config overrides passed to every run")
    args = parser.parse_args(argv)
    judged = {seed: run_demo(seed, False, args.overrides) for seed in args.seeds}
    controls = {} if args.no_control else {seed: run_demo(seed, True, args.overrides) for seed in args.seeds}
    print(f"{'run':<16}{'first':>8}{'last':>8}{'rise':>8}{'judge':>8}{'steps':>7}{'seconds':>9}")
    for name, results in (("judge", judged), ("control", controls)):
        for seed, numbers in results.items():
            if numbers is not None:
                print(
                    f"{name + ' seed ' + str(seed):<16}{numbers['first']:>8.3f}{numbers['last']:>8.3f}"
                    f"{numbers['rise']:>8.3f}{numbers['judge']:>8.3f}{numbers['steps']:>7.0f}{numbers['seconds']:>9.0f}"
                )
    rose = all(numbers is not None and numbers["rise"] >= args.bar for numbers in judged.values())
    flat = all(numbers is not None and numbers["rise"] < args.bar for numbers in controls.values())
    print(f"verdict: judged runs rose by >= {args.bar}: {rose}; controls stayed below: {flat}")
    return 0 if rose and flat else 1


if __name__ == "__main__":
    sys.exit(main())
