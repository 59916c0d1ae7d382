#!/bin/bash
# Pass@k training (Chen et al. 2025, arXiv:2508.10751) on Geometry3K with Qwen2.5-VL-7B-Instruct: only the best of
# each group of worker.rollout.n samples gets a non-zero advantage (max minus second max, over the group's std), which
# rewards exploration towards pass@n rather than pass@1. Everything else as in config.yaml.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_grpo_passk.sh [more key=value overrides]
# (PYTHON=... picks the interpreter; default: python3 of the active environment, e.g. `source .venv/bin/activate`)
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    algorithm.adv_estimator=grpo_passk \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_grpo_passk \
    "$@"
