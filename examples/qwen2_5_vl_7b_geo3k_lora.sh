#!/bin/bash
# GRPO with LoRA (peft) on Geometry3K with Qwen2.5-VL-7B-Instruct: only a rank-64 adapter on every linear layer of the
# language model is trained (the vision tower is excluded by default); the reference policy is the base model (the
# adapter switched off), vLLM samples with the merged weights. LoRA wants a larger learning rate than full fine-tuning.
# The export holds the merged model and huggingface/lora_adapter (peft format). See docs/lora.md.
# Run from the repository root: bash examples/qwen2_5_vl_7b_geo3k_lora.sh [more key=value overrides]
set -x

MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct  # a hub id, or a local folder holding the model

${PYTHON:-python3} -m easyrl.trainer \
    config=config.yaml \
    worker.actor.model.model_path=${MODEL_PATH} \
    worker.actor.model.lora.rank=64 \
    worker.actor.model.lora.alpha=64 \
    worker.actor.model.lora.target_modules=all-linear \
    worker.actor.optim.lr=1.0e-5 \
    trainer.experiment_name=qwen2_5_vl_7b_geo3k_lora \
    trainer.n_gpus_per_node=8 \
    "$@"
