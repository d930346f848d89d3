"""TRL's settings on this machine: ``peer_trl.py`` under each setting a TRL user could pick, beside the plain script.

Picks the settings ``peer_bench.py``'s TRL lines use (its ``TRL_SETTINGS``). Every variant is one change from the
``hf`` line (``peer_trl.py`` as the bench runs it), runs are interleaved over repetitions, each in its own process,
and the table gives the median s/step over steps 2-8, its generation share, CPU seconds per wall second and the
ratio to the plain script (``plain_trl_grpo.py``) of the same repetition.

    python bench/peer_trl_sweep.py                          # every variant at 0.6M, one repetition
    python bench/peer_trl_sweep.py --sizes 15M --variants hf,hf-bf16,vllm --reps 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import (  # noqa: E402
    DISTRIBUTED_VARIABLES,
    NEW_TOKENS,
    PROMPTS,
    REPO,
    RESULTS,
    SAMPLES_PER_PROMPT,
    THREADS,
    TRL_PYTHON,
    ensure_assets,
    run_env,
)


# name: (engine, peer_trl.py arguments); engine "plain" is plain_trl_grpo.py. The extra "env" of a variant is set
# on top of the bench's TRL environment.
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "plain": ("plain", []),
    "hf": ("hf", []),
    # the two causes found: TRL's default gradient checkpointing, and the distributed variables the bench used to set
    "hf-gc": ("hf", ["--set", "gradient_checkpointing=true"]),
    "hf-dist-env": ("hf", []),
    # the bench's TRL before 2026-11-27: both of the above, and a log line every step
    "hf-old-bench": ("hf", ["--set", "gradient_checkpointing=true", "--set", "logging_steps=1"]),
    # what a TRL user on CPU could change (use_transformers_continuous_batching=true is refused for multimodal models:
    # "does not support multimodal models. Use `use_vllm` instead.")
    "hf-bf16": ("hf", ["--bf16"]),
    "hf-1thread": ("hf", ["--threads", "1"]),
    "hf-compile": ("hf", ["--set", "torch_compile=true"]),
    "hf-static-cache": ("hf", ["--set", 'cache_implementation="static"']),
    "hf-log-every-step": ("hf", ["--set", "logging_steps=1"]),
    "hf-loader-worker": ("hf", ["--set", "dataloader_num_workers=1"]),
    "vllm": ("vllm", []),
    "vllm-auto-dtype": ("vllm", ["--vllm-dtype", "auto"]),
    "vllm-bf16": ("vllm", ["--bf16", "--vllm-dtype", "auto"]),
}
DIST_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"}


def run_variant(name: str, model: Path, data: Path, steps: int, work: Path) -> dict:
    """One run of variant ``name``; its per-step records (step, cpu, gen where known)."""
    engine, extra = VARIANTS[name]
    out = work / f"{name}.json"
    if engine == "plain":
        command = [str(TRL_PYTHON), str(REPO / "bench" / "plain_trl_grpo.py"), "--model", str(model)]
        command += ["--data", str(data), "--steps", str(steps), "--out", str(out), "--workdir", str(work / name)]
    else:
        command = [str(TRL_PYTHON), str(REPO / "bench" / "peer_trl.py"), "--model", str(model), "--data", str(data)]
        command += ["--engine", engine, "--steps", str(steps), "--threads", str(THREADS), "--out", str(out)]
        command += ["--prompts", str(PROMPTS), "--n", str(SAMPLES_PER_PROMPT), "--max-tokens", str(NEW_TOKENS)]
        command += ["--workdir", str(work / name), *extra]
    env = run_env(THREADS, trl=True)
    if name in ("hf-dist-env", "hf-old-bench"):
        env.update(DIST_ENV)
    else:
        assert not any(k in env for k in DISTRIBUTED_VARIABLES)
    log = work / f"{name}.log"
    with log.open("w") as file:
        code = subprocess.run(command, env=env, cwd=REPO, stdout=file, stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"{name} exit {code}: " + "\n".join(log.read_text(errors="replace").splitlines()[-5:]))
    return json.loads(out.read_text())


def main() -> None:
    """Run the variants interleaved; print the table and save the raw numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.6M")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    sizes, names = args.sizes.split(","), args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}")
    models, data = ensure_assets(sizes)
    work = Path(f"/tmp/peer_trl_sweep_{int(time.time())}")
    work.mkdir(parents=True)
    results: dict[str, dict[str, list[dict]]] = {size: {} for size in sizes}
    for rep in range(1, args.reps + 1):
        for size in sizes:
            for name in names:
                run_dir = work / f"{size}-{rep}"
                run_dir.mkdir(exist_ok=True)
                start = time.time()
                try:
                    steps = run_variant(name, models[size], data, args.steps, run_dir)["steps"]
                except RuntimeError as error:
                    print(f"[rep {rep}] {size} {name}: FAILED {error}", flush=True)
                    continue
                results[size].setdefault(name, []).append({"rep": rep, "steps": steps})
                window = steps[1:8]
                print(
                    f"[rep {rep}] {size} {name}: {statistics.median(s['step'] for s in window):.3f} s/step "
                    f"({time.time() - start:.0f} s)",
                    flush=True,
                )

    def median_of(runs: list[dict], key: str) -> float:
        return statistics.median(statistics.median(s[key] for s in r["steps"][1:8]) for r in runs)

    print("\nmedian s/step over steps 2-8 (median over repetitions); cpu/wall: CPU seconds per second of the step")
    print(f"{'size':6} {'variant':24} {'s/step':>7} {'gen':>6} {'cpu/wall':>8} {'vs plain':>8} {'vs hf':>6}")
    for size in sizes:
        by_name = results[size]
        plain = median_of(by_name["plain"], "step") if "plain" in by_name else float("nan")
        hf = median_of(by_name["hf"], "step") if "hf" in by_name else float("nan")
        for name, runs in by_name.items():
            step = median_of(runs, "step")
            gen = median_of(runs, "gen")
            cpu = median_of(runs, "cpu") / step
            print(f"{size:6} {name:24} {step:7.3f} {gen:6.3f} {cpu:8.2f} {step / plain:8.2f} {step / hf:6.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"peer-trl-sweep-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "variants": VARIANTS, "results": results}, indent=1))
    print(f"\nraw numbers: {out}")


if __name__ == "__main__":
    main()
