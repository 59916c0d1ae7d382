#!/bin/bash
# GRPO on Geometry3K (config.yaml's job) with an LLM judge beside the rule reward: Qwen2.5-7B-Instruct, a second vLLM
# engine on every GPU (resident: rollout 0.5 + judge 0.25 of each GPU, pre-flight estimate 71.6 of 80 GiB), reads each
# problem's text, reference answer and response through easyrl/rewards/judge.jinja and answers 1 (correct) or 0. The
# judge reads text only (the problem's <image> placeholder, not the image): it judges whether the final answer matches
# the reference in any notation. overall = math.py's overall + 0.5 x the verdict (docs/judge.md).
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_judge.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # the policy: a hub id, or a local folder holding the model
JUDGE_PATH=Qwen/Qwen2.5-7B-Instruct  # the judge: an instruct model vLLM serves (a hub id or a local folder)

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.rollout.gpu_memory_utilization=0.5 \
    worker.reward.judge.model_path=${JUDGE_PATH} \
    worker.reward.judge.prompt_template=easyrl/rewards/judge.jinja \
    worker.reward.judge.weight=0.5 \
    worker.reward.judge.max_tokens=16 \
    worker.reward.judge.gpu_memory_utilization=0.25 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_judge \
    "$@"
