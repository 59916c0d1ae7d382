#!/bin/bash
# GRPO on Geometry3K with Qwen2.5-VL-7B-Instruct on 8 GPUs: config.yaml as documented, nothing changed.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_grpo \
    "$@"
