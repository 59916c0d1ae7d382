#!/bin/bash
# GRPO on Geometry3K with Qwen2.5-VL-7B-Instruct on one node of 8 Ascend NPUs (torch_npu + vllm-ascend, HCCL).
# Install in the vllm-ascend image with `uv pip install --system -e ".[npu,wandb]"` (see the Dockerfile's Ascend note).
# Everything else as in config.yaml; trainer.n_gpus_per_node counts NPUs here.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_grpo_npu.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.device=npu \
    trainer.n_gpus_per_node=8 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_grpo_npu \
    "$@"
