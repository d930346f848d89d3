"""The plan of EasyR1's published performance baselines, side by side with what EasyR1 measured.

EasyR1's ``assets/baselines.md`` (v0.3.0, hiyouga/EasyR1) lists Qwen2.5-VL GRPO on Geometry3K with its
``examples/config.yaml`` (the same values as ours) on 8 GPUs per node: micro-batches (update / experience), vLLM TP,
peak host memory, peak VRAM, tokens per second per GPU and seconds per step. This script plans the same configs from
the checkpoints' shapes (``easyr1.plan.reference_models``, no weights) and prints one markdown table with the ratios
plan / measured. No run happens here: it is arithmetic, seconds on any machine.

Lengths for the step time: the baselines' tokens per sample follow from their own throughput
(``tokens/s/GPU x GPUs x seconds / samples``); the plan gets that mean length (prompt 400 tokens, the rest response)
through ``prompt_fill`` / ``response_fill``. Memory is planned at the maximum lengths, as always.

    PYTHONPATH=$PWD .venv/bin/python bench/plan_baselines.py [--mfu 0.1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


SAMPLES = 512 * 5  # rollout_batch_size x n of the example config
MEAN_PROMPT = 400  # a Geometry3K prompt: one image at min_pixels (~330 tokens) and its question

# size, GPU, bits, update / experience micro-batch, TP, peak host GB, peak VRAM GB, tokens/s/GPU, s/step
BASELINES = [
    ("3b", "H100", "AMP", 4, 16, 2, 120, 35, 1200, 180),
    ("7b", "H100", "AMP", 4, 16, 2, 140, 60, 1200, 180),
    ("7b", "H100", "AMP", 10, 20, 2, 150, 75, 1400, 170),
    ("7b", "L20", "AMP", 4, 16, 2, 150, 44, 410, 580),
    ("7b", "H100", "BF16", 4, 16, 2, 150, 50, 1280, 190),
    ("32b", "H100", "BF16", 1, 8, 8, 240, 68, 360, 860),
]


def main() -> None:
    """Plan every baseline and print the comparison table."""
    from easyr1.config import load_config
    from easyr1.plan.check import plan_run
    from easyr1.plan.hardware import gpu_device
    from easyr1.plan.reference_models import write_reference_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mfu", type=float, default=0.1)
    args = parser.parse_args()
    print(
        "| model | GPU | bits | mb | TP | host GB: EasyR1 / plan (ratio) | VRAM GB: EasyR1 / plan update / plan peak "
        "(ratio to update) | s/step: EasyR1 / plan (ratio) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size, gpu, bits, update_mb, exp_mb, tp, host, vram, throughput, seconds in BASELINES:
            model = write_reference_model(f"qwen2.5-vl-{size}", Path(tmp) / size)
            overrides = [
                "config=examples/config.yaml",
                f"worker.actor.model.model_path={model}",
                f"worker.actor.micro_batch_size_per_device_for_update={update_mb}",
                f"worker.actor.micro_batch_size_per_device_for_experience={exp_mb}",
                f"worker.rollout.tensor_parallel_size={tp}",
            ]
            if bits == "BF16":
                overrides += ["worker.actor.fsdp.torch_dtype=bf16", "worker.actor.optim.strategy=adamw_bf16"]
            config = load_config(overrides)
            mean_length = throughput * 8 * seconds / SAMPLES
            prompt_fill = MEAN_PROMPT / config.data.max_prompt_length
            response_fill = max(mean_length - MEAN_PROMPT, 1) / config.data.max_response_length
            plan, _ = plan_run(
                config, gpu_device(gpu), mfu=args.mfu, prompt_fill=prompt_fill, response_fill=response_fill
            )
            update = next(phase.total for phase in plan.phases if phase.name == "actor update") / 1e9
            host_plan = plan.host_node_total / 1e9  # EasyR1 reports GB
            print(
                f"| Qwen2.5-VL-{size.upper()} | 8x {gpu} | {bits} | {update_mb}/{exp_mb} | {tp} "
                f"| {host} / {host_plan:.0f} ({host_plan / host:.2f}) "
                f"| {vram} / {update:.0f} / {plan.device_peak / 1e9:.0f} ({update / vram:.2f}) "
                f"| {seconds} / {plan.step_seconds:.0f} ({plan.step_seconds / seconds:.2f}) |"
            )


if __name__ == "__main__":
    main()
