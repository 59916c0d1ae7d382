#!/bin/bash
# Multi-turn GRPO with a tool (docs/agents.md): Qwen3-4B-Instruct-2507 on MATH may call a calculator
# (examples/agents/tools.py) in the Hermes format its chat template teaches (<tool_call>{json}</tool_call>); the
# tool's answers come back as tool turns, outside the loss, and the reward grades the last assistant turn's \boxed{}.
# Up to 5 assistant turns in data.max_response_length tokens.
# Run from the repository root: bash examples/qwen3_4b_math12k_calculator_agent.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen3-4B-Instruct-2507  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    data.train_files=hiyouga/math12k@train \
    data.val_files=hiyouga/math12k@test \
    data.prompt_key=problem \
    data.answer_key=answer \
    data.format_prompt=examples/agents/calculator.jinja \
    data.max_response_length=4096 \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.rollout.limit_images=0 \
    worker.rollout.multi_turn.enable=true \
    "worker.rollout.multi_turn.tools=[examples/agents/tools.py:calculator]" \
    worker.rollout.multi_turn.format=hermes \
    worker.rollout.multi_turn.max_assistant_turns=5 \
    worker.rollout.multi_turn.tool_timeout_s=10 \
    worker.reward.reward_function=examples/agents/reward.py:compute_score \
    "worker.reward.reward_function_kwargs={}" \
    trainer.experiment_name=qwen3_4b_math12k_calculator_agent \
    "$@"
