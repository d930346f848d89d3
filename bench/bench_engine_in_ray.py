"""Does vLLM generate slower inside a Ray actor than in a process of its own?

easyr1's engine runs in a Ray actor (the hybrid worker); the peer benchmark's bare-vLLM line runs in a plain process.
This bench builds the same engine twice — once in a Ray actor started as easyr1 starts its workers (the same
thread count, vLLM's CPU variables, niceness 0 as the peer bench sets it) and once in the calling process — and
alternates their calls on the same requests (the peer benchmark's: each call the next step's prompts, n samples
per prompt as n seeded requests, blocks of 32 as easyr1 builds its engine). Each call is timed where it runs, so
Ray's own call overhead is not in the numbers. Prints both medians, the per-call ratio and whether both engines
gave the same tokens.

    python bench/bench_engine_in_ray.py [--size 0.6M] [--calls 14]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import (  # noqa: E402
    MAX_PIXELS,
    MIN_PIXELS,
    NEW_TOKENS,
    PROMPTS,
    REPO,
    SAMPLES_PER_PROMPT,
    THREADS,
    ensure_assets,
    run_env,
)


class Engine:
    """One bare vLLM engine on the peer benchmark's requests (in a Ray actor or in this process)."""

    def __init__(self, model_dir: str, data_dir: str, calls: int, port: int) -> None:
        sys.path[:0] = [str(REPO / "bench"), str(REPO)]  # a Ray actor starts without this script's path
        import torch
        import torch.distributed as dist
        from peer_vllm import build_engine, build_requests

        torch.set_num_threads(THREADS)
        # external_launcher: one rank of its own process group, as in easyr1's worker
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.requests = build_requests(model_dir, data_dir, PROMPTS * calls, (MIN_PIXELS, MAX_PIXELS))
        self.llm = build_engine(model_dir, "float32:32", PROMPTS * SAMPLES_PER_PROMPT)

    def generate(self, call: int) -> tuple[float, list[list[int]]]:
        """Call ``call``'s requests: the seconds ``LLM.generate`` took here, and the tokens of every sample."""
        from peer_vllm import step_requests

        batch, params = step_requests(self.requests, call, PROMPTS, SAMPLES_PER_PROMPT, NEW_TOKENS)
        start = time.perf_counter()
        outputs = self.llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - start, [list(output.outputs[0].token_ids) for output in outputs]


def main() -> None:
    """Build both engines, alternate their calls, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.6M", help="a peer-benchmark model size (0.6M, 15M)")
    parser.add_argument("--calls", type=int, default=14, help="timed calls per engine, after 2 warm-up calls")
    args = parser.parse_args()
    models, data = ensure_assets([args.size])
    env = run_env(THREADS)
    os.environ.update({key: env[key] for key in ("OMP_NUM_THREADS", "RAY_worker_niceness")})
    engine_env = {
        key: env[key] for key in ("OMP_NUM_THREADS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")
    }
    os.environ.update(engine_env, VLLM_LOGGING_LEVEL="ERROR")
    import ray

    from easyr1.main import closed_local_cluster

    with closed_local_cluster():  # loopback only, Ray's token required: as easyr1.main starts its cluster
        ray.init(
            num_cpus=THREADS,
            include_dashboard=False,
            logging_level="WARNING",
            runtime_env={"env_vars": {**engine_env, "VLLM_LOGGING_LEVEL": "ERROR"}},
        )
    calls = args.calls + 2
    in_actor = ray.remote(num_cpus=1)(Engine).remote(str(models[args.size]), str(data), calls, 29561)
    ray.get(in_actor.__ray_ready__.remote())
    in_process = Engine(str(models[args.size]), str(data), calls, 29562)
    times: dict[str, list[float]] = {"ray actor": [], "own process": []}
    same = 0
    for call in range(calls):
        results = {}
        # alternate which goes first, so drift of the machine's speed falls on both
        for where in list(times) if call % 2 == 0 else list(times)[::-1]:
            if where == "ray actor":
                results[where] = ray.get(in_actor.generate.remote(call))
            else:
                results[where] = in_process.generate(call)
            if call >= 2:
                times[where].append(results[where][0])
        same += results["ray actor"][1] == results["own process"][1]
    ray.shutdown()
    for where, seconds in times.items():
        print(f"{where:12s} median {statistics.median(seconds):.4f} s, min {min(seconds):.4f} s")
    ratios = [a / b for a, b in zip(times["ray actor"], times["own process"])]
    print("ray actor / own process per call:", " ".join(f"{r:.2f}" for r in ratios))
    print(f"median {statistics.median(ratios):.3f}; calls with the same tokens: {same} of {calls}")


if __name__ == "__main__":
    main()
