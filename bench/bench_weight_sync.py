"""The weight sync into vLLM's CPU engine: vLLM's ``reload_weights`` against easyr1's CPU path, in one run.

For each model: one in-process ``vllm.LLM`` (fp32, eager, external launcher as in a worker), its checkpoint's
weights synced ``--repeats`` times by each path, alternating, so that load from elsewhere on the machine hits both
alike; prints the median and best wall time per sync, their ratio, and the CPU time of the process's threads
(less disturbed by other load on the machine than wall time). Before timing it checks that both paths give
the same greedy tokens and log-probs after a sync of perturbed weights.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_weight_sync.py MODEL_DIR [MODEL_DIR ...] [--threads 2]

Each model runs in its own subprocess (one engine per process).
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import statistics
import subprocess
import sys
import time


def run_one(model: str, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from vllm import LLM, SamplingParams

    from easyr1.engines import vllm_cpu_weight_sync

    llm = LLM(
        model=model,
        dtype="float32",
        seed=0,
        distributed_executor_backend="external_launcher",
        max_model_len=128,
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        disable_log_stats=True,
    )
    assert llm.collective_rpc(vllm_cpu_weight_sync.prepare)[0] is None
    weights: dict[str, torch.Tensor] = {}
    for path in glob.glob(f"{model}/*.safetensors"):
        weights.update(load_file(path))

    def reload(named: dict[str, torch.Tensor]) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named.items())})

    def fast(named: dict[str, torch.Tensor]) -> None:
        llm.collective_rpc(vllm_cpu_weight_sync.load, args=(iter(named.items()),))

    def greedy() -> tuple[list[int], list[float]]:
        llm.reset_prefix_cache()
        params = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
        out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5]}], params, use_tqdm=False)[0].outputs[0]
        return list(out.token_ids), [step[token].logprob for step, token in zip(out.logprobs, out.token_ids)]

    generator = torch.Generator().manual_seed(0)
    perturbed = {
        name: t + 0.05 * torch.randn(t.shape, generator=generator) if t.is_floating_point() else t
        for name, t in weights.items()
    }
    fast(perturbed)
    fast_result = greedy()
    reload(perturbed)
    same = fast_result == greedy()

    times: dict[str, list[float]] = {"reload_weights": [], "easyr1 CPU path": []}
    cpu_times: dict[str, list[float]] = {"reload_weights": [], "easyr1 CPU path": []}
    for _ in range(3):
        reload(weights)
        fast(weights)
    for _ in range(repeats):
        for name, sync in (("reload_weights", reload), ("easyr1 CPU path", fast)):
            start, start_cpu = time.perf_counter(), time.process_time()
            sync(weights)
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - start_cpu)
    params = sum(t.numel() for t in weights.values())
    print(
        f"{os.path.basename(model)}: {params / 1e6:.2f} M parameters, {torch.get_num_threads()} threads, "
        f"tokens and log-probs equal after a perturbed sync: {same}"
    )
    for name, values in times.items():
        print(
            f"  {name:16s} median {statistics.median(values) * 1e3:6.1f} ms   best {min(values) * 1e3:6.1f} ms   "
            f"CPU time (all threads) median {statistics.median(cpu_times[name]) * 1e3:6.1f} ms"
        )
    ratio = statistics.median(times["easyr1 CPU path"]) / statistics.median(times["reload_weights"])
    print(f"  ratio of medians (CPU path / reload_weights): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the per-model subprocess
    args = parser.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        run_one(args.models[0], args.repeats)
        return
    for model in args.models:
        command = [sys.executable, __file__, model, "--one", f"--threads={args.threads}", f"--repeats={args.repeats}"]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})


if __name__ == "__main__":
    main()
