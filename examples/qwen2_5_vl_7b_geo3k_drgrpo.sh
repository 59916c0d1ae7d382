#!/bin/bash
# Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) on Geometry3K with Qwen2.5-VL-7B-Instruct: advantages are not divided
# by the group's reward std, and each sequence's token-loss sum is divided by the constant max_response_length
# instead of its own length (no length bias), averaged over the sequences as in the paper (verl 0.7.1-0.9.1's
# seq-mean-token-sum-norm; verl <= 0.7.0 summed over them). Everything else as in config.yaml.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_drgrpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    algorithm.norm_adv_by_std_in_grpo=false \
    worker.actor.loss_agg_mode=seq-mean-token-sum-norm-drgrpo \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_drgrpo \
    "$@"
