#!/usr/bin/env bash
# DAPO (Yu et al. 2025): clip-higher, token-mean loss, dynamic sampling, overlong reward shaping, no KL.
# Qwen2.5-VL-7B-Instruct on Geometry3K, one node of 8 GPUs. On the tiny CPU model instead (built by
#   python -m easyr1.tools.demo_assets):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/demo/model/qwen2_5_vl bash examples/qwen2_5_vl_7b_geo3k_dapo.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    algorithm.disable_kl=true \
    algorithm.online_filtering=true \
    algorithm.filter_key=accuracy \
    worker.actor.clip_ratio_low=0.2 \
    worker.actor.clip_ratio_high=0.28 \
    worker.actor.loss_agg_mode=token-mean \
    worker.reward.reward_function=./reward_function/dapo.py:compute_score \
    worker.reward.reward_function_kwargs.max_response_length=2048 \
    worker.reward.reward_function_kwargs.overlong_buffer_length=512 \
    worker.reward.reward_function_kwargs.overlong_penalty_factor=1.0 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_dapo \
    "$@"
