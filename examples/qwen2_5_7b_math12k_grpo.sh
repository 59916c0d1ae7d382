#!/bin/bash
# Text-only GRPO: Qwen2.5-7B-Instruct on MATH (12k training problems, the 500-problem MATH500 test split). The data
# has no image column, so prompts are plain text; the math.py reward and the math.jinja prompt work unchanged.
# Run from the repository root: bash examples/qwen2_5_7b_math12k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    data.train_files=hiyouga/math12k@train \
    data.val_files=hiyouga/math12k@test \
    data.prompt_key=problem \
    data.answer_key=answer \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.rollout.limit_images=0 \
    trainer.experiment_name=qwen2_5_7b_math12k_grpo \
    "$@"
