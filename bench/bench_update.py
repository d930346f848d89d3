"""The update's forward + backward against the CPU's matmul peak: achieved FLOP/s, MFU, and what prompt sharing saves.

Workload of issue 11: the tiny Qwen2.5-VL at two sizes (hidden 128 x 2 layers, ~0.8 M parameters; hidden 512 x 6
layers, ~15 M), 4 prompts x 8 samples (84x84 images: 9 vision tokens), 32-token responses, fp32, the actor's
``response_log_probs`` plus a policy-gradient loss and its backward, micro-batches of ``--micro-batch`` rows taken
as the update takes them (consecutive slices of the driver's ``aabb`` order).

Measured in one process, interleaved (every repetition runs every variant once, in turn), medians reported:

- the peak: ``torch.matmul`` at the model's own shapes (tokens x hidden @ hidden x {hidden, intermediate, vocab})
  in fp32 and bf16 with ``--threads`` threads, best of a few;
- per variant, FLOPs counted by ``torch.utils.flop_counter`` (every matmul and attention product of the forward and
  backward, vision tower included) and the time of a forward + backward: achieved FLOP/s and MFU against the fp32
  peak; "work/s" divides the first variant's FLOPs (``padded`` by default: the same update, every
  sample's prompt counted) by the variant's time, so it compares variants on equal work; "speed-up" is the first
  variant's time over the variant's.

Variants: ``padded`` (no packing), ``padding_free`` (packed, each sample's prompt again),
``padding_free-dense-attention`` (the same with transformers' SDPA over the whole packed row, as before
``block_attention.py``), ``shared``
(``share_prompt``: each prompt once per micro-batch), ``shared-dense-attention`` (the same with transformers' SDPA over
the whole packed row, as before ``block_attention.py``), and ``shared+entropy-graph`` (the entropy metric computed
with a graph, as it was before it moved under ``no_grad`` without an entropy bonus). Timings on a shared machine
are disturbed by other work: read the ratios, which are taken within one run.

    python bench/bench_update.py [--threads 2] [--micro-batch 8] [--repeats 5] [--sizes small,large]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import pack_responses
from easyr1.models.loading import load_model, load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import build_shape_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers import block_attention
from easyr1.workers.actor import computed_tokens, micro_batches, response_log_probs


SIZES = {  # name -> language-model shape (the vision tower's output follows hidden_size)
    "small": {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "heads": 4, "kv_heads": 2},
    "large": {"hidden_size": 512, "num_hidden_layers": 6, "intermediate_size": 1024, "heads": 16, "kv_heads": 8},
}
VARIANTS = {
    "padded": {},
    "padding_free": {"padding_free": True},
    "padding_free-dense-attention": {"padding_free": True, "dense_attention": True},
    "shared": {"share_prompt": True},
    "shared-dense-attention": {"share_prompt": True, "dense_attention": True},
    "shared+entropy-graph": {"share_prompt": True, "entropy_grad": True},
}


def build_model(root: Path, size: str) -> Path:
    """A tiny Qwen2.5-VL of ``size``: ``build_tiny_model``'s own size keywords where it has them, else its small
    model's directory with the language model's shape changed and fresh random weights."""
    shape = SIZES[size]
    out = root / f"qwen2_5_vl_{size}"
    keywords = inspect.signature(build_tiny_model).parameters
    if size == "small":
        return build_tiny_model(out, family="qwen2_5_vl", seed=0)
    if "hidden_size" in keywords:
        return build_tiny_model(
            out,
            family="qwen2_5_vl",
            seed=0,
            hidden_size=shape["hidden_size"],
            num_layers=shape["num_hidden_layers"],
            intermediate_size=shape["intermediate_size"],
        )
    from transformers import AutoConfig, AutoModelForImageTextToText

    base = build_tiny_model(root / "base", family="qwen2_5_vl", seed=0)
    shutil.copytree(base, out, dirs_exist_ok=True)
    config = json.loads((base / "config.json").read_text())
    text = config["text_config"]
    text.update(
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        intermediate_size=shape["intermediate_size"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
    )
    text.pop("layer_types", None)
    config["vision_config"]["out_hidden_size"] = shape["hidden_size"]
    (out / "config.json").write_text(json.dumps(config))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(out), dtype=torch.float32)
    for stale in out.glob("*.safetensors*"):
        stale.unlink()
    model.save_pretrained(out, safe_serialization=True)
    return out


def workload(model_dir: Path, data_dir: Path, prompts: int, n: int, response_length: int) -> Batch:
    """``prompts`` x ``n`` rows in the driver's ``aabb`` order, 84x84 images, full-length random responses."""
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=64,
        min_pixels=84 * 84,
        max_pixels=84 * 84,
        model_config=load_model_config(str(model_dir)),
    )
    rows = collate_fn([dataset[i] for i in range(prompts)]).index([p for p in range(prompts) for _ in range(n)])
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, 300, (response_length,), generator=generator).tolist() for _ in range(len(rows))]
    batch = pack_responses(rows, responses, [[0.0] * response_length] * len(rows), response_length, pad_token_id=0)
    batch["advantages"] = torch.randn(len(rows), response_length, generator=generator)
    return batch


@contextlib.contextmanager
def attention_over_whole_row(dense: bool) -> Iterator[None]:
    """With ``dense``, transformers' own SDPA (every score of the packed row) instead of easyr1's block-wise one."""
    block_attention.install()
    if not dense:
        yield
        return
    AttentionInterface.register("sdpa", sdpa_attention_forward)
    try:
        yield
    finally:
        AttentionInterface.register("sdpa", block_attention.blockwise_sdpa_forward)


def update_pass(model: torch.nn.Module, parts: list[Batch], options: dict) -> None:
    """Forward + backward of a policy-gradient loss over the micro-batches, as the update runs them."""
    options = {"entropy_grad": False, **options}
    with attention_over_whole_row(options.pop("dense_attention", False)):
        for part in parts:
            log_probs, entropy = response_log_probs(
                model, part, 1.0, with_entropy=True, banned_token_ids=[5], **options
            )
            loss = -(log_probs * part["advantages"] * part["response_mask"]).sum() / part["response_mask"].sum()
            loss.backward()
            float(entropy.detach().mean())  # the metric the update reports
    model.zero_grad(set_to_none=True)


def counted_flops(model: torch.nn.Module, parts: list[Batch], options: dict) -> int:
    """FLOPs of one :func:`update_pass` (matmuls and attention, forward and backward)."""
    counter = FlopCounterMode(display=False)
    with counter:
        update_pass(model, parts, options)
    return counter.get_total_flops()


def matmul_peak(tokens: int, hidden: int, widths: list[int], dtype: torch.dtype, repeats: int = 5) -> float:
    """Best FLOP/s over the model's matmul shapes (tokens x hidden @ hidden x width), ``dtype``."""
    best = 0.0
    for width in widths:
        first, second = torch.randn(tokens, hidden).to(dtype), torch.randn(hidden, width).to(dtype)
        torch.matmul(first, second)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(first, second)
            times.append(time.perf_counter() - start)
        best = max(best, 2.0 * tokens * hidden * width / min(times))
    return best


def main() -> None:
    """Build the models and the workload, measure, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per forward/backward (update micro-batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    root = Path(tempfile.mkdtemp(prefix="bench_update_"))
    data_dir = build_shape_dataset(root / "data", num_train=16, num_val=4, seed=0)
    print(
        f"threads={args.threads} micro_batch={args.micro_batch} prompts={args.prompts} n={args.n} "
        f"response_length={args.response_length} repeats={args.repeats} (medians; interleaved)"
    )
    header = (
        f"{'size':6} {'params':>7} {'variant':22} {'tokens':>6} {'GFLOP':>7} {'s/pass':>7} {'GFLOP/s':>8} "
        f"{'MFU32':>6} {'work/s':>7} {'speed-up':>8}"
    )
    lines = []
    for size in args.sizes.split(","):
        model_dir = build_model(root, size)
        model = load_model(str(model_dir), torch.float32)
        model.train()
        batch = workload(model_dir, data_dir, args.prompts, args.n, args.response_length)
        parts = [part for _, part in micro_batches(batch, args.micro_batch, dynamic=False)]
        params = sum(p.numel() for p in model.parameters())
        text = model.config.text_config
        valid_tokens = int(batch["attention_mask"].sum())
        widths = [text.hidden_size, text.intermediate_size, text.vocab_size]
        peaks = {
            dtype: matmul_peak(valid_tokens // len(parts), text.hidden_size, widths, dtype)
            for dtype in (torch.float32, torch.bfloat16)
        }
        flops = {name: counted_flops(model, parts, options) for name, options in variants.items()}
        tokens = {
            name: sum(computed_tokens(part, options.get("share_prompt", False)) for part in parts)
            for name, options in variants.items()
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for options in variants.values():  # warm-up
            update_pass(model, parts, options)
        for _ in range(args.repeats):
            for name, options in variants.items():
                start = time.perf_counter()
                update_pass(model, parts, options)
                times[name].append(time.perf_counter() - start)
        lines.append(
            f"{size}: peak matmul at the model's shapes ({valid_tokens // len(parts)} tokens x {text.hidden_size} @ "
            f"{text.hidden_size} x {widths}): fp32 {peaks[torch.float32] / 1e9:.1f} GFLOP/s, "
            f"bf16 {peaks[torch.bfloat16] / 1e9:.1f} GFLOP/s "
            f"(bf16/fp32 {peaks[torch.bfloat16] / peaks[torch.float32]:.2f})"
        )
        median = {name: statistics.median(values) for name, values in times.items()}
        reference = next(iter(variants))  # the ratios are against the first variant listed
        for name in variants:
            achieved = flops[name] / median[name]
            lines.append(
                f"{size:6} {params / 1e6:6.1f}M {name:22} {tokens[name]:6d} {flops[name] / 1e9:7.2f} "
                f"{median[name]:7.3f} {achieved / 1e9:8.1f} {achieved / peaks[torch.float32]:6.2f} "
                f"{flops[reference] / median[name] / 1e9:7.1f} {median[reference] / median[name]:7.2f}x"
            )
    print(header)
    for line in lines:
        print(line)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
