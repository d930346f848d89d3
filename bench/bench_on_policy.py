"""The on-policy shortcut measured in one run: a separate old-log-prob pass + the update vs the update alone.

One process, the tiny Qwen2.5-VL sharded with FSDP2 on one gloo rank, the demo's actor settings (fp32, micro-batches
of 64 for the no-grad pass and 32 for the update). Both ways run on the same batch (``prompts * n`` samples with
random responses of ``--response-length`` tokens), interleaved, ``--repeats`` times each; the script prints the
median seconds of each way and their ratio. Times vary with machine load, the ratio much less.

    python bench/bench_on_policy.py [--prompts 4] [--n 8] [--response-length 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from easyr1.config import load_config
from easyr1.data import RLDataset, collate_fn
from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
from easyr1.engines.base import pack_responses
from easyr1.models.loading import load_model, load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import build_shape_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers.actor import Actor


REPO = Path(__file__).resolve().parents[1]


def rollout_batch(model_dir: Path, data_dir: Path, prompts: int, n: int, response_length: int) -> Batch:
    """``prompts`` dataset prompts repeated ``n`` times, with random full-length responses and advantages."""
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=64,
        min_pixels=3136,
        max_pixels=3136,
        model_config=load_model_config(str(model_dir)),
    )
    batch = collate_fn([dataset[i] for i in range(prompts)]).repeat(n)
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 300, (len(batch), response_length), generator=generator).tolist()
    batch = pack_responses(batch, responses, [[0.0] * response_length] * len(batch), response_length, 0)
    batch["advantages"] = torch.randn(len(batch), response_length, generator=generator)
    fields = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "multi_modal_inputs")
    return batch.select(*fields, "advantages")


def build_actor(model_dir: Path, actor_config) -> Actor:
    """The actor as a worker builds it: FSDP2-sharded (one rank), AdamW."""
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return Actor(model, actor_config, optimizer, banned_token_ids=[model.config.image_token_id])


def main() -> None:
    """Build the tiny model and data, time both ways interleaved, print the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    root = Path(tempfile.mkdtemp(prefix="bench_on_policy_"))
    model_dir = build_tiny_model(root / "model")
    data_dir = build_shape_dataset(root / "data", num_train=args.prompts, num_val=1)
    actor_config = load_config([f"config={REPO / 'examples' / 'config_cpu.yaml'}"], validate=False).worker.actor
    batch = rollout_batch(model_dir, data_dir, args.prompts, args.n, args.response_length)
    separate_actor, shortcut_actor = build_actor(model_dir, actor_config), build_actor(model_dir, actor_config)

    def separate() -> None:
        old = separate_actor.compute_log_probs(batch, 1.0, actor_config.micro_batch_size_per_device_for_experience)
        separate_actor.update_policy(batch.union(Batch(tensors={"old_log_probs": old})), 1.0, len(batch))

    def shortcut() -> None:
        shortcut_actor.update_on_policy(batch, 1.0)

    times: dict[str, list[float]] = {"separate pass + update": [], "update alone (shortcut)": []}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, run in zip(times, (separate, shortcut)):
            start = time.perf_counter()
            run()
            if repeat:
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    tokens = int(batch["attention_mask"].sum())
    threads = torch.get_num_threads()
    print(f"{len(batch)} samples, {tokens} tokens, {args.repeats} interleaved repeats, {threads} threads")
    for name, seconds in medians.items():
        print(f"  {name:<26} {seconds:7.3f} s")
    separate_s, shortcut_s = medians.values()
    print(f"  speed-up of the shortcut: {separate_s / shortcut_s:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
