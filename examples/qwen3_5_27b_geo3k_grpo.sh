#!/bin/bash
# GRPO on Geometry3K with Qwen3.5-27B (dense; hybrid Gated DeltaNet + gated attention layers, natively multimodal:
# Qwen3_5ForConditionalGeneration) on one node of 8 GPUs with 80 GB or more. The actor's parameters, gradients and
# Adam states stay on the host (offload_params); vLLM runs with tensor parallelism 2 (4 engines, each split over 2
# devices: 25 of the 50 GiB of bf16 weights per device, leaving room for the KV cache), and sleeps and frees its memory
# while the actor trains. `pip install flash-linear-attention causal-conv1d` gives the actor the
# fast Gated DeltaNet kernels (transformers falls back to a slow PyTorch implementation without them). vLLM requires
# chunked prefill for the Gated DeltaNet state cache ("Chunked prefill is required for mamba cache mode 'align'").
# Run from the repository root: bash examples/qwen3_5_27b_geo3k_grpo.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen3.5-27B  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.offload.offload_params=true \
    worker.actor.micro_batch_size_per_device_for_update=1 \
    worker.actor.micro_batch_size_per_device_for_experience=4 \
    worker.rollout.tensor_parallel_size=2 \
    worker.rollout.gpu_memory_utilization=0.6 \
    worker.rollout.enable_chunked_prefill=true \
    trainer.n_gpus_per_node=8 \
    trainer.experiment_name=qwen3_5_27b_geo3k_grpo \
    "$@"
