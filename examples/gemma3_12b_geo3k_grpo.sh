#!/usr/bin/env bash
# GRPO on Gemma 3 (google/gemma-3-12b-it) on Geometry3K, one node of 8 GPUs (80 GB each; the 27B model needs two
# nodes: trainer.nnodes=2). Each image is 256 soft tokens at the processor's fixed 896x896, whatever data.max_pixels
# says. Image blocks attend bidirectionally in the trainer and in vLLM on GPU; prompt sharing is off for this family
# (its masks come from token types). LoRA, if enabled (worker.actor.model.lora.rank), skips the SigLIP tower and the
# projector. On the tiny CPU model instead (python -m easyr1.tools.tiny_model .cache/gemma3 --family gemma3):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/gemma3 bash examples/gemma3_12b_geo3k_grpo.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-google/gemma-3-12b-it}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    worker.actor.model.lora.exclude_modules='.*\b(vision_tower|multi_modal_projector)\b.*' \
    worker.actor.micro_batch_size_per_device_for_update=2 \
    worker.actor.micro_batch_size_per_device_for_experience=8 \
    worker.rollout.gpu_memory_utilization=0.5 \
    trainer.experiment_name=gemma3_12b_geo3k_grpo \
    "$@"
