"""Rollout engines compared in one run: vLLM vs Hugging Face ``generate`` on the demo workload.

Both engines sample the same prompts (the tiny Qwen2.5-VL, 56x56 images, ``n`` samples per prompt) in one
process; the script prints generated tokens per second for each and their ratio. Times vary with machine load,
the ratio much less.

    python bench/bench_rollout.py [--prompts 16] [--n 8] [--max-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import SamplingSettings
from easyr1.engines.hf_engine import HFEngine
from easyr1.engines.vllm_engine import VLLMEngine
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.tools.tiny_dataset import build_shape_dataset
from easyr1.tools.tiny_model import build_tiny_model


def tokens_per_second(engine, prompts, settings: SamplingSettings, repeats: int) -> float:
    """Generated tokens per second over ``repeats`` calls, after one warm-up call."""
    seeds = list(range(len(prompts)))
    engine.generate(prompts, settings, seeds)
    tokens, start = 0, time.perf_counter()
    for _ in range(repeats):
        tokens += int(engine.generate(prompts, settings, seeds)["response_mask"].sum())
    return tokens / (time.perf_counter() - start)


def main() -> None:
    """Build the tiny model and data, run both engines, print tokens/s and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))

    root = Path(tempfile.mkdtemp(prefix="bench_rollout_"))
    model_dir = build_tiny_model(root / "model")
    data_dir = build_shape_dataset(root / "data", num_train=args.prompts, num_val=1)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=64,
        min_pixels=3136,
        max_pixels=3136,
        model_config=load_model_config(str(model_dir)),
    )
    prompts = collate_fn([dataset[i] for i in range(args.prompts)]).repeat(args.n)
    settings = SamplingSettings(max_tokens=args.max_tokens, ignore_eos=True)
    banned = [load_model_config(str(model_dir)).image_token_id]

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    vllm_engine = VLLMEngine(
        str(model_dir),
        str(model_dir),
        dtype=torch.float32,
        max_model_len=128,
        tensor_parallel_size=1,
        seed=0,
        pad_token_id=tokenizer.pad_token_id,
        banned_token_ids=banned,
    )
    hf_engine = HFEngine(
        str(model_dir),
        dtype=torch.float32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
        banned_token_ids=banned,
        device="cpu",
    )
    vllm_speed = tokens_per_second(vllm_engine, prompts, settings, args.repeats)
    hf_speed = tokens_per_second(hf_engine, prompts, settings, args.repeats)
    print(f"samples={len(prompts)} max_tokens={args.max_tokens} threads={torch.get_num_threads()}")
    print(f"vllm: {vllm_speed:.0f} tokens/s")
    print(f"hf:   {hf_speed:.0f} tokens/s")
    print(f"ratio vllm/hf: {vllm_speed / hf_speed:.2f}")


if __name__ == "__main__":
    main()
