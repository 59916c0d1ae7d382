#!/bin/bash
# PPO with a learned critic and GAE (Schulman et al. 2016, arXiv:1506.02438; PPO arXiv:1707.06347) on Geometry3K with
# Qwen2.5-VL-7B-Instruct: the critic starts from the actor's checkpoint with a zero value head (worker.critic.*), one
# sample per prompt is enough (no group baseline), lambda 1 and gamma 1 (the Monte-Carlo return minus the value).
# Everything else as in config.yaml. See docs/algorithms.md ("PPO with a learned critic").
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_ppo.sh [more key=value overrides]
# (PYTHON=... picks the interpreter; default: python3 of the active environment, e.g. `source .venv/bin/activate`)
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=1.0 \
    worker.rollout.n=1 \
    worker.critic.optim.lr=1.0e-5 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_ppo \
    "$@"
