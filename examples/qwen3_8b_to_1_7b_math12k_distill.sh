#!/bin/bash
# On-policy distillation (docs/distillation.md): Qwen3-8B teaches Qwen3-1.7B on MATH (12k training problems). The
# student samples its own responses; the teacher scores each sampled token, and the per-token reverse KL
# log pi_student - log pi_teacher is the (negative) advantage (algorithm.adv_estimator=on_policy_distill, Thinking
# Machines 2025). Both models share Qwen3's tokenizer (checked before the workers start). For RL mixed with
# distillation instead: algorithm.adv_estimator=grpo algorithm.distill_coef=0.1 (the reward's advantage minus 0.1 x
# the reverse KL). The teacher is sharded over the GPUs like the reference and offloaded to the host between its passes.
# Run from the repository root: bash examples/qwen3_8b_to_1_7b_math12k_distill.sh [more key=value overrides]
set -x

STUDENT=Qwen/Qwen3-1.7B   # hub ids, or local folders holding the models
TEACHER=Qwen/Qwen3-8B

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    data.train_files=hiyouga/math12k@train \
    data.val_files=hiyouga/math12k@test \
    data.prompt_key=problem \
    data.answer_key=answer \
    data.max_response_length=4096 \
    algorithm.adv_estimator=on_policy_distill \
    algorithm.disable_kl=true \
    algorithm.use_kl_loss=false \
    worker.actor.model.model_path=${STUDENT} \
    worker.teacher.model.model_path=${TEACHER} \
    worker.teacher.offload.offload_params=true \
    worker.rollout.n=4 \
    worker.rollout.limit_images=0 \
    trainer.experiment_name=qwen3_8b_to_1_7b_math12k_distill \
    "$@"
