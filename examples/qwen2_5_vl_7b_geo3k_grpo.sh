#!/usr/bin/env bash
# GRPO (Shao et al. 2024): group-normalised advantages, KL to the reference as a loss.
# Qwen2.5-VL-7B-Instruct on Geometry3K, one node of 8 GPUs. On the tiny CPU model instead (built by
#   python -m easyr1.tools.demo_assets):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/demo/model/qwen2_5_vl bash examples/qwen2_5_vl_7b_geo3k_grpo.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_grpo \
    "$@"
