#!/usr/bin/env bash
# REINFORCE++ (Hu 2025): discounted returns whitened over the batch, KL in the reward.
# Qwen2.5-VL-7B-Instruct on Geometry3K, one node of 8 GPUs. On the tiny CPU model instead (built by
#   python -m easyr1.tools.demo_assets):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/demo/model/qwen2_5_vl bash examples/qwen2_5_vl_7b_geo3k_reinforce.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    algorithm.adv_estimator=reinforce_plus_plus \
    algorithm.use_kl_loss=false \
    algorithm.kl_penalty=kl \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_reinforce \
    "$@"
