#!/bin/bash
# GRPO on Geometry3K with Qwen3-VL-30B-A3B-Instruct (MoE: 128 experts, 8 active, ~3B active parameters) on one node of
# 8 GPUs with 80 GB or more. FSDP2 shards the experts like any other parameter (the fused expert tensors along the
# expert dimension); the actor's parameters, gradients and Adam states stay on the host (offload_params). vLLM runs
# with tensor parallelism 4: 2 engines per node, each split over 4 devices (58 GiB of bf16 weights, ~15 GiB per
# device), which sleep and free them while the actor trains. The same split fits 64 GB Ascend 910B devices: the NPU
# variant, over 2 nodes with HCCL timeouts and jemalloc in worker.env_vars, is examples/qwen3_vl_30b_a3b_geo3k_grpo_npu.sh
# (keep tensor_parallel_size a divisor of trainer.n_gpus_per_node, so that no engine spans two machines).
# Run from the repository root: bash examples/qwen3_vl_30b_a3b_geo3k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen3-VL-30B-A3B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.offload.offload_params=true \
    worker.actor.micro_batch_size_per_device_for_update=1 \
    worker.actor.micro_batch_size_per_device_for_experience=4 \
    worker.rollout.tensor_parallel_size=4 \
    worker.rollout.gpu_memory_utilization=0.6 \
    worker.actor.loss_agg_mode=seq-mean-token-mean \
    algorithm.kl_penalty=low_var_kl \
    algorithm.kl_coef=1.0e-2 \
    worker.rollout.n=5 \
    trainer.n_gpus_per_node=8 \
    trainer.experiment_name=qwen3_vl_30b_a3b_geo3k_grpo \
    "$@"
