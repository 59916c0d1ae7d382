#!/bin/bash
# GRPO on Geometry3K with the smaller Qwen2.5-VL-3B-Instruct; everything else as in config.yaml.
# Fewer devices also work when worker.actor.global_batch_size * worker.rollout.n (128 * 5 = 640 samples) splits evenly
# over them in multiples of worker.actor.micro_batch_size_per_device_for_update (4), e.g. trainer.n_gpus_per_node=4.
# Run from the repository root: bash examples/qwen2_5_vl_3b_geo3k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-3B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.experiment_name=qwen2_5_vl_3b_geo3k_grpo \
    trainer.n_gpus_per_node=8 \
    "$@"
