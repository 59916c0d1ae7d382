#!/bin/bash
# CISPO (MiniMax 2025, MiniMax-M1, arXiv:2506.13585, Eq. 4-5) on Geometry3K with Qwen2.5-VL-7B-Instruct: the
# importance weight clipped and detached (no token's gradient is dropped), no lower bound (clip_ratio_low 1.0), token
# mean over the mini-batch as in the paper. Everything else as in config.yaml.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_cispo.sh [more key=value overrides]
# (PYTHON=... picks the interpreter; default: python3 of the active environment, e.g. `source .venv/bin/activate`)
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.loss_type=cispo \
    worker.actor.loss_agg_mode=token-mean \
    worker.actor.clip_ratio_low=1.0 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_cispo \
    "$@"
