#!/bin/bash
# GRPO with a rule reward and a reward model mixed (docs/rewards.md): Qwen2.5-7B-Instruct on MATH, scored by the math
# rule (correctness and format, 0..1) plus Skywork-Reward-V2-Qwen3-1.7B (a Qwen3 sequence classifier, its own chat
# template) at weight 0.05, so that correctness stays first and the reward model breaks ties within a group.
# overall = rule overall + 0.05 x score/reward_model; both parts are logged (reward/accuracy, reward/reward_model).
# The reward model alone: add worker.reward.reward_function=null (and weight 1.0).
# Run from the repository root: bash examples/qwen2_5_7b_math12k_grpo_reward_model.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-7B-Instruct  # a hub id, or a local folder holding the model
RM_PATH=Skywork/Skywork-Reward-V2-Qwen3-1.7B  # any AutoModelForSequenceClassification with num_labels 1

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    data.train_files=hiyouga/math12k@train \
    data.val_files=hiyouga/math12k@test \
    data.prompt_key=problem \
    data.answer_key=answer \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.rollout.limit_images=0 \
    worker.reward.reward_model.model_path=${RM_PATH} \
    worker.reward.reward_model.weight=0.05 \
    worker.reward.reward_model.max_length=4096 \
    trainer.experiment_name=qwen2_5_7b_math12k_grpo_reward_model \
    "$@"
