"""Bare vLLM on the peer benchmark's requests: the floor easyr1's generation phase is compared with.

Builds the same prompts easyr1 sends (its dataset's ``raw_prompt_ids`` and images: ``--prompts`` prompts, ``--n``
samples each, ``--max-tokens`` tokens at temperature 1) and times ``vllm.LLM.generate`` on them the way easyr1 times
``timing/gen``: one call per step, after warm-up calls that absorb the one-off compilation. Call k gets the prompts
of easyr1's step k + 1 (dataset rows in order, as the benchmark's unshuffled runs take them), so the engine's prefix
and multimodal caches help it only as much as they help a trainer, whose prompts are new every step;
``--repeat-prompts`` sends the first step's prompts every call instead (every call after the first then finds its
prompts and images cached). The engine is built as easyr1 builds it (``external_launcher``, compiled unless
``--enforce-eager``, the same max_model_len), in one process with the threads easyr1's single worker gets and
vLLM's log level at ERROR, as easyr1 runs it. Each ``--engine`` is a dtype, optionally with a KV-cache block size
(``float32:32``); without one the block size is vLLM's own choice (128 on CPU), as a user calling ``vllm.LLM`` gets
it. Writes a JSON file with the per-call times and generated tokens per engine. With ``--serve N`` it builds one engine
and answers calls from standard input instead (see :func:`serve`).

    python bench/peer_vllm.py --model DIR --data DIR --engine float32 --engine float32:32 --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch


def build_requests(model_dir: str, data_dir: str, prompts: int, pixels: tuple[int, int]) -> list[dict]:
    """easyr1's vLLM prompts (token ids with one image pad per image, plus the images) for the first rows."""
    from easyr1.data import RLDataset
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor

    tokenizer, processor = load_tokenizer_and_processor(model_dir)
    dataset = RLDataset(
        str(Path(data_dir) / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=64,
        min_pixels=pixels[0],
        max_pixels=pixels[1],
        model_config=load_model_config(model_dir),
    )
    rows = [dataset[i] for i in range(prompts)]
    return [
        {"prompt_token_ids": row["raw_prompt_ids"], "multi_modal_data": {"image": row["multi_modal_data"]["images"]}}
        for row in rows
    ]


def build_engine(model_dir: str, engine: str, rows: int, enforce_eager: bool = False):
    """``vllm.LLM`` as easyr1 builds its engine (external launcher, the KV cache easyr1 sizes for ``rows`` rows at
    once), for ``engine``: a dtype, optionally with a KV-cache block size (``float32:32``)."""
    from vllm import LLM

    from easyr1.engines.vllm_engine import cpu_kv_cache_bytes
    from easyr1.models.loading import load_model_config

    text_config = load_model_config(model_dir).text_config
    dtype, _, block_size = engine.partition(":")
    return LLM(
        model=model_dir,
        dtype=dtype,
        seed=0,
        distributed_executor_backend="external_launcher",
        max_model_len=128,
        enforce_eager=enforce_eager,
        kv_cache_memory_bytes=cpu_kv_cache_bytes(text_config, rows, 128, getattr(torch, dtype)),
        disable_log_stats=True,
        logprobs_mode="processed_logprobs",
        **({"block_size": int(block_size)} if block_size else {}),
    )


def step_requests(requests: list[dict], call: int, prompts: int, n: int, max_tokens: int) -> tuple[list, list]:
    """Call ``call``'s requests and their sampling parameters: the next ``prompts`` prompts, ``n`` samples each as
    ``n`` requests with their own seeds (how easyr1 sent them before it grouped a prompt's samples)."""
    from vllm import SamplingParams

    prompts_of_call = requests[call * prompts : (call + 1) * prompts]
    params = [
        SamplingParams(
            temperature=1.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            seed=1000 * call + k,
            logprobs=0,
            detokenize=False,  # as easyr1 asks: it decodes the responses itself, for the reward
        )
        for k in range(n)
    ]
    return [p for p in prompts_of_call for _ in range(n)], [sp for _ in prompts_of_call for sp in params]


def time_engine(model_dir: str, engine: str, requests: list[dict], args: argparse.Namespace) -> dict:
    """Build one engine (``dtype`` or ``dtype:block_size``); time ``args.calls`` generate calls after
    ``args.warmup`` untimed ones."""
    calls = args.warmup + args.calls
    llm = build_engine(model_dir, engine, len(requests) * args.n, args.enforce_eager)
    times, tokens = [], []
    for call in range(calls):
        batch, params = step_requests(requests, call, len(requests) // calls, args.n, args.max_tokens)
        start = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        if call >= args.warmup:
            times.append(seconds)
            tokens.append(sum(len(output.outputs[0].token_ids) for output in outputs))
    del llm
    return {"times": times, "tokens": tokens}


def serve(model_dir: str, engine: str, requests: list[dict], args: argparse.Namespace) -> None:
    """Answer calls from standard input, one at a time: a line ``K`` runs call ``K``'s requests (as
    :func:`step_requests` picks them) and prints ``RESULT {"call": K, "seconds": ..., "tokens": ...}``; an empty
    line or end of input ends. Prints ``READY`` once the engine is built. Another program can so time this engine
    between its own steps (``bench_gen_paired.py``)."""
    llm = build_engine(model_dir, engine, args.prompts * args.n, args.enforce_eager)
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        call = int(line)
        batch, params = step_requests(requests, call, args.prompts, args.n, args.max_tokens)
        start = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
        print("RESULT " + json.dumps({"call": call, "seconds": seconds, "tokens": tokens}), flush=True)


def main() -> None:
    """Parse arguments, time each dtype, write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--enforce-eager", action="store_true", help="as worker.rollout.enforce_eager=true")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument(
        "--engine", action="append", default=None, help="DTYPE or DTYPE:BLOCK_SIZE, repeatable; default float32"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--min-pixels", type=int, default=3136)
    parser.add_argument("--max-pixels", type=int, default=12544)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--repeat-prompts", action="store_true", help="the same prompts in every call")
    parser.add_argument("--serve", type=int, default=0, help="answer calls from stdin on the first N prompts")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    # easyr1's workers run vLLM at ERROR: at WARNING its CPU worker logs a line each time torch.set_num_threads is
    # called during a generate (~56 a call here), ~2% of a 0.15 s call that the floor should not pay
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    port = os.environ.setdefault("MASTER_PORT", "29541")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if args.serve:
        requests = build_requests(args.model, args.data, args.serve, (args.min_pixels, args.max_pixels))
        serve(args.model, (args.engine or ["float32"])[0], requests, args)
        return
    if not args.out:
        parser.error("--out is required (unless --serve)")
    calls = args.warmup + args.calls
    rows = args.prompts if args.repeat_prompts else args.prompts * calls
    requests = build_requests(args.model, args.data, rows, (args.min_pixels, args.max_pixels))
    if args.repeat_prompts:
        requests = requests * calls
    result = {engine: time_engine(args.model, engine, requests, args) for engine in args.engine or ["float32"]}
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
