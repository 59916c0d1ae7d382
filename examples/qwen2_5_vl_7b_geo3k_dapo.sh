#!/bin/bash
# DAPO on Geometry3K with Qwen2.5-VL-7B-Instruct: clip-higher (0.2 / 0.28), token-mean loss, no KL, DAPO's +1/-1 reward
# with the soft overlong punishment, and dynamic sampling (groups whose samples all got the same accuracy are dropped
# and more prompts are sampled until the batch is full: algorithm.online_filtering). The recipe is a YAML of its own.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_dapo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=examples/configs/qwen2_5_vl_7b_geo3k_dapo.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_dapo \
    "$@"
