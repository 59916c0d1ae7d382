#!/bin/bash
# DAPO on Geometry3K with Qwen2.5-VL-7B-Instruct: clip-higher (0.2 / 0.28), token-mean loss, no KL, DAPO's +1/-1 reward
# with the soft overlong punishment. Dynamic sampling (refilling the batch after dropping all-equal groups) is not
# implemented yet. The recipe is a YAML of its own (see its header for why it is not an override list).
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_dapo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

python3 -m easyrl.trainer \
    config=examples/configs/qwen2_5_vl_7b_geo3k_dapo.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_dapo \
    "$@"
