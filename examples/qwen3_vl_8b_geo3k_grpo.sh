#!/bin/bash
# GRPO on Geometry3K with Qwen3-VL-8B-Instruct, with the settings used for Qwen3-VL-8B geo3k GRPO runs on Ascend NPUs:
# the sequence-mean of per-sequence token means (GRPO's original loss), the k3 KL loss with coefficient 0.01 and
# 5 samples per prompt; the rest as in config.yaml. On NPUs add trainer.device=npu.
# Run from the repository root: bash examples/qwen3_vl_8b_geo3k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen3-VL-8B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.loss_agg_mode=seq-mean-token-mean \
    algorithm.kl_penalty=low_var_kl \
    algorithm.kl_coef=1.0e-2 \
    worker.rollout.n=5 \
    trainer.experiment_name=qwen3_vl_8b_geo3k_grpo \
    "$@"
