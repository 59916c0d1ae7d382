#!/bin/bash
# GRPO on Geometry3K with Qwen3-VL-30B-A3B-Instruct (MoE: 128 experts, 8 active) on 2 nodes x 8 Ascend 910B NPUs
# (64 GB each; torch_npu + vllm-ascend, HCCL), the source recipes' setting. vLLM runs with tensor parallelism 4 (58 GiB
# of bf16 weights, ~15 GiB per NPU; 4 engines, none spanning two machines); the actor's parameters, gradients and
# Adam states stay on the host. Start Ray first: `ray start --head` on the first node, `ray start --address=HEAD_IP:6379`
# on the second (docs/multinode.md), then run this on the head node. The worker environment sets HCCL's timeouts
# (seconds) for the cross-node links and jemalloc (less host memory fragmentation with offloaded states); adjust
# JEMALLOC to your image's path (aarch64 shown).
# Run from the repository root: bash examples/qwen3_vl_30b_a3b_geo3k_grpo_npu.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen3-VL-30B-A3B-Instruct  # a hub id, or a local folder holding the model (on every node)
JEMALLOC=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    trainer.device=npu \
    trainer.nnodes=2 \
    trainer.n_gpus_per_node=8 \
    worker.env_vars="{HCCL_CONNECT_TIMEOUT: '1800', HCCL_EXEC_TIMEOUT: '1800', LD_PRELOAD: ${JEMALLOC}}" \
    worker.actor.offload.offload_params=true \
    worker.actor.micro_batch_size_per_device_for_update=1 \
    worker.actor.micro_batch_size_per_device_for_experience=4 \
    worker.rollout.tensor_parallel_size=4 \
    worker.rollout.gpu_memory_utilization=0.6 \
    worker.actor.loss_agg_mode=seq-mean-token-mean \
    algorithm.kl_penalty=low_var_kl \
    algorithm.kl_coef=1.0e-2 \
    worker.rollout.n=5 \
    trainer.experiment_name=qwen3_vl_30b_a3b_geo3k_grpo_npu \
    "$@"
