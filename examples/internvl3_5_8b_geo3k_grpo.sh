#!/usr/bin/env bash
# GRPO on Geometry3K with InternVL3.5-8B (the transformers format: InternVLForConditionalGeneration, a Qwen3-8B
# language model and InternViT-300M), one node of 8 GPUs. Each image is cut into 448-pixel tiles (by its aspect
# ratio: one for a square image, up to 12 and a thumbnail) of 256 tokens each; the config's 2048 prompt tokens keep
# images of up to 7 tiles (longer prompts are filtered out, data.filter_overlong_prompts). The pixel bounds only size
# the image the tiles are cut from: from one tile's pixels to eight tiles'.
# Video frames are one tile each. On the tiny CPU model instead (built by
#   python -m easyr1.tools.tiny_model .cache/demo/model/internvl --family internvl):
#   CONFIG=examples/config_cpu.yaml MODEL_PATH=.cache/demo/model/internvl bash examples/internvl3_5_8b_geo3k_grpo.sh trainer.max_steps=3
set -euo pipefail
CONFIG=${CONFIG:-examples/config.yaml}
MODEL_PATH=${MODEL_PATH:-OpenGVLab/InternVL3_5-8B-HF}

python3 -m easyr1.main \
    config="${CONFIG}" \
    worker.actor.model.model_path="${MODEL_PATH}" \
    data.min_pixels=200704 \
    data.max_pixels=1605632 \
    trainer.experiment_name=internvl3_5_8b_geo3k_grpo \
    "$@"
