#!/bin/bash
# GRPO on Geometry3K with Qwen2.5-VL-7B-Instruct on one node of 8 Ascend NPUs (torch_npu + vllm-ascend 0.23, HCCL).
# Install: docs/ascend.md (the vllm-ascend image, or pip; not `uv pip install` from this folder without --no-config).
# Everything else as in config.yaml; trainer.n_gpus_per_node counts NPUs here. The worker environment sets HCCL's
# timeouts (seconds) as the source recipes do, and jemalloc (less host memory fragmentation with the offloaded reference
# and states); adjust JEMALLOC to your image's path (aarch64 shown). easyrl itself sets VLLM_ASCEND_ENABLE_NZ=0 on the
# workers (the colocated engine must sleep and wake).
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_grpo_npu.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model
JEMALLOC=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.device=npu \
    trainer.n_gpus_per_node=8 \
    worker.env_vars="{HCCL_CONNECT_TIMEOUT: '1800', HCCL_EXEC_TIMEOUT: '1800', LD_PRELOAD: ${JEMALLOC}}" \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_grpo_npu \
    "$@"
