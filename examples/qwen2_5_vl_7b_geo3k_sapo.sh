#!/bin/bash
# SAPO (Gao et al. 2025, Soft Adaptive Policy Optimization, arXiv:2511.20347) on Geometry3K with Qwen2.5-VL-7B-Instruct:
# PPO's hard clip replaced by a soft sigmoid gate, temperature 1.0 for positive and 1.05 for negative advantages,
# token means averaged per sequence as in the paper, no KL term (EasyR1's SAPO recipe). Everything else as in
# config.yaml. Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_sapo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.loss_type=sapo \
    worker.actor.tau_positive=1.0 \
    worker.actor.tau_negative=1.05 \
    worker.actor.loss_agg_mode=seq-mean-token-mean \
    algorithm.disable_kl=true \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_sapo \
    "$@"
