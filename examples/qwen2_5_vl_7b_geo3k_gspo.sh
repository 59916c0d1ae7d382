#!/bin/bash
# GSPO (Zheng et al. 2025, arXiv:2507.18071) on Geometry3K with Qwen2.5-VL-7B-Instruct: sequence-level importance
# ratio clipped to [1 - 3e-4, 1 + 4e-4], averaged over sequences as in the paper. Only the policy loss differs from
# config.yaml (its KL loss stays on; add algorithm.disable_kl=true for a KL-free run).
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_gspo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.loss_type=gspo \
    worker.actor.loss_agg_mode=seq-mean-token-mean \
    worker.actor.clip_ratio_low=3.0e-4 \
    worker.actor.clip_ratio_high=4.0e-4 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_gspo \
    "$@"
