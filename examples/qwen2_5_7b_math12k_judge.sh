#!/bin/bash
# GRPO on MATH with an LLM judge beside the rule reward: Qwen2.5-7B-Instruct (the judge, a second vLLM engine on every
# GPU, resident: rollout 0.5 + judge 0.3 of each GPU) reads each problem, reference answer and response through
# examples/judge/judge.jinja and answers 1 (correct) or 0; overall = math.py's overall + 0.5 x the judge's verdict.
# docs/judge.md explains the keys. Run from the repository root: bash examples/qwen2_5_7b_math12k_judge.sh [overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-7B-Instruct  # the policy: a hub id, or a local folder holding the model
JUDGE_PATH=Qwen/Qwen2.5-7B-Instruct  # the judge: any instruct model vLLM serves (a hub id or a local folder)

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    data.train_files=hiyouga/math12k@train \
    data.val_files=hiyouga/math12k@test \
    data.prompt_key=problem \
    data.answer_key=answer \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.rollout.limit_images=0 \
    worker.rollout.gpu_memory_utilization=0.5 \
    worker.reward.judge.model_path=${JUDGE_PATH} \
    worker.reward.judge.prompt_template=examples/judge/judge.jinja \
    worker.reward.judge.parser=number \
    worker.reward.judge.weight=0.5 \
    worker.reward.judge.max_tokens=16 \
    worker.reward.judge.gpu_memory_utilization=0.3 \
    trainer.experiment_name=qwen2_5_7b_math12k_judge \
    "$@"
