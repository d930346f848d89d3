#!/usr/bin/env bash
# GRPO on GLM-4.1V-9B-Thinking (zai-org/GLM-4.1V-9B-Thinking, model_type glm4v) on Geometry3K, one node of 8 GPUs
# (80 GB each): the Qwen2.5-VL-7B recipe's settings; python -m easyr1.tools.plan plans 48 GiB a device on H100s.
# GLM-4.1V writes video frames with its image token; easyr1 places them by the begin/end-of-video markers (see
# easyr1/models/families/glm.py). On the tiny CPU model instead (python -m easyr1.tools.tiny_model OUT --family glm4v):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=OUT bash examples/glm4_1v_9b_geo3k_grpo.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-zai-org/GLM-4.1V-9B-Thinking}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    trainer.experiment_name=glm4_1v_9b_geo3k_grpo \
    "$@"
