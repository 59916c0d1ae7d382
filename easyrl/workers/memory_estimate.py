"""Pre-flight device-memory estimate: will this run fit on one device, before minutes of loading end in an OOM?

A worker holds, on its one device (the colocated vLLM engine holds 1 / ``worker.rollout.tensor_parallel_size`` of
the model's weights: the tensor-parallel engines shard every layer, embeddings included; the few replicated norms are
not counted apart):

* rollout phase: vLLM's claim, ``gpu_memory_utilization x device memory`` (its weights in the rollout dtype + the KV
  cache in what is left of that claim), beside what the actor and the reference keep resident while vLLM runs: the
  actor's float32 parameter shard and AdamW's two float32 moments (``4 + 8`` bytes per parameter / world size, unless
  ``worker.actor.offload.offload_params``) and the reference's shard in the compute dtype (unless
  ``worker.ref.offload.offload_params``);
* training phase: vLLM asleep (level 2: ~0), the actor's shard + float32 gradients + AdamW moments, the reference,
  and the logits of one update micro-batch (``micro x (response_length + 1) x vocab`` in the compute dtype, twice
  with their gradient).

With LoRA (``worker.actor.model.lora.rank > 0``) the base weights are frozen: no gradients or AdamW moments for them
(the adapter's own, typically < 1% of the parameters, are not counted) and no reference copy (the reference policy is
the base with the adapter disabled).

With an LLM judge (``worker.reward.judge``), its engine's claim (``judge.gpu_memory_utilization x device memory``) in
both phases: it has no sleep mode beside the rollout engine (``easyrl.workers.judge``). Its judge phase (the rollout
engine asleep) needs less than the rollout phase.
A reward model (``worker.reward.reward_model``) adds its shard in the compute dtype to both phases unless
``worker.reward.reward_model.offload.offload_params`` (the default, as the reference's).

Not counted (the estimate is a lower bound): activations (small with gradient checkpointing), the transient unsharded
block FSDP2 gathers, CUDA context and NCCL buffers (~1-2 GiB), allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from easyrl.config import PPOConfig
from easyrl.errors import ConfigError
from easyrl.workers.roles import builds_reference, uses_lora

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass
class MemoryEstimate:
    """GiB per device, item by item, for the two phases of a step, and the device's capacity."""

    capacity_gib: float
    vllm_weights_gib: float
    tensor_parallel_size: int
    vllm_claim_gib: float
    rollout: dict[str, float] = field(default_factory=dict)
    training: dict[str, float] = field(default_factory=dict)

    @property
    def rollout_gib(self) -> float:
        return sum(self.rollout.values())

    @property
    def training_gib(self) -> float:
        return sum(self.training.values())


def estimate_memory(num_params: int, vocab_size: int, config: PPOConfig, capacity_gib: float,
                    reward_model_params: int = 0) -> MemoryEstimate:
    """The per-device estimate for ``config`` (see the module docstring for what is counted).

    Args:
        num_params: parameters of the model (embeddings counted once when tied).
        vocab_size: rows of the output layer (logits width).
        config: the finalized run configuration (world size, offload, dtypes, micro-batch, lengths).
        capacity_gib: total memory of one device, GiB.
        reward_model_params: parameters of the reward model (0: none; :func:`reward_model_parameters`).
    """
    worker = config.worker
    world = config.world_size
    shard = num_params / world
    compute_bytes = DTYPE_BYTES[worker.actor.fsdp.param_dtype]
    actor_on_device = not worker.actor.offload.offload_params
    lora = uses_lora(config)  # frozen base: no grads/Adam for it, and the reference is the base itself
    ref_on_device = builds_reference(config) and not worker.ref.offload.offload_params
    actor = worker.actor  # stored weights in fsdp.torch_dtype (fp32 by default); adamw_bf16 moments take 2 bytes each
    param_bytes = DTYPE_BYTES[actor.fsdp.torch_dtype] if actor.fsdp.torch_dtype else 4
    moment_bytes = 2 if actor.optim.strategy == "adamw_bf16" else param_bytes
    params = param_bytes * shard / GIB if actor_on_device else 0.0
    adam = 2 * moment_bytes * shard / GIB if actor_on_device and not lora else 0.0
    adam_in_rollout = 0.0 if actor.offload.offload_optimizer else adam  # offload_optimizer: on the host until update
    grads = 0.0 if lora else params
    reference = compute_bytes * shard / GIB if ref_on_device else 0.0
    claim = worker.rollout.gpu_memory_utilization * capacity_gib
    micro = worker.actor.micro_batch_size_per_device_for_update
    logits = 2 * micro * (config.data.max_response_length + 1) * vocab_size * compute_bytes / GIB
    # PPO with GAE: the critic is a second trained copy (fp32 params, grads, Adam), without the vocabulary-wide logits
    critic_on_device = config.algorithm.needs_critic and not worker.critic.offload.offload_params
    critic = 12 * shard / GIB if critic_on_device else 0.0
    critic_grads = 4 * shard / GIB if critic_on_device else 0.0
    rm = worker.reward.reward_model  # frozen, in the compute dtype, resident unless offloaded
    reward_model = 0.0 if rm.offload.offload_params else DTYPE_BYTES[rm.param_dtype] * reward_model_params / world / GIB
    estimate = MemoryEstimate(
        capacity_gib=capacity_gib,
        vllm_weights_gib=num_params * DTYPE_BYTES[worker.rollout.dtype] / GIB / worker.rollout.tensor_parallel_size,
        tensor_parallel_size=worker.rollout.tensor_parallel_size,
        vllm_claim_gib=claim,
        rollout={"vLLM (gpu_memory_utilization)": claim, "actor params": params, "actor Adam states": adam_in_rollout,
                 "reference": reference, "critic params + Adam states": critic},
        training={"actor params": params, "actor grads": grads, "actor Adam states": adam, "reference": reference,
                  "logits (one micro-batch)": logits, "critic params + grads + Adam states": critic + critic_grads},
    )
    judge = worker.reward.judge
    if judge.model_path is not None:  # the LLM judge's engine stays resident (easyrl.workers.judge: no sleep mode)
        for phase in (estimate.rollout, estimate.training):
            phase["judge vLLM (worker.reward.judge.gpu_memory_utilization)"] = judge.gpu_memory_utilization * \
                capacity_gib
    if reward_model_params:
        estimate.rollout["reward model"] = estimate.training["reward model"] = reward_model
    return estimate


def _items(items: dict[str, float]) -> str:
    return ", ".join(f"{name} {gib:.1f}" for name, gib in items.items() if gib > 0)


def check_memory(estimate: MemoryEstimate) -> None:
    """Stop a run that cannot fit, with the numbers and the settings to change.

    Raises:
        ConfigError: vLLM's weights do not fit in its claim (no room for a KV cache), or a phase needs more than the
            device has.
    """
    e = estimate
    cap = e.capacity_gib
    offload = ("worker.actor.offload.offload_params=true / worker.ref.offload.offload_params=true (and "
               "worker.critic.offload.offload_params=true with a critic)")
    if e.vllm_weights_gib >= e.vllm_claim_gib:
        raise ConfigError(
            f"vLLM's weights ({e.vllm_weights_gib:.1f} GiB in worker.rollout.dtype) do not fit in its share of the "
            f"device, worker.rollout.gpu_memory_utilization x {cap:.1f} GiB = {e.vllm_claim_gib:.1f} GiB, leaving no "
            "KV cache: raise worker.rollout.tensor_parallel_size (now "
            f"{e.tensor_parallel_size}) to split each engine's weights over more devices, raise "
            f"worker.rollout.gpu_memory_utilization (and offload the actor/reference: {offload}), or use devices "
            "with more memory."
        )
    if e.rollout_gib > cap:
        raise ConfigError(
            f"The rollout phase needs ~{e.rollout_gib:.1f} GiB per device but it has {cap:.1f} GiB "
            f"({_items(e.rollout)} GiB): set {offload}, lower worker.rollout.gpu_memory_utilization, or use more "
            "devices (trainer.n_gpus_per_node / trainer.nnodes: smaller shards)."
        )
    if e.training_gib > cap:
        raise ConfigError(
            f"The training phase needs ~{e.training_gib:.1f} GiB per device but it has {cap:.1f} GiB "
            f"({_items(e.training)} GiB): set {offload}, lower worker.actor.micro_batch_size_per_device_for_update, "
            "or use more devices (trainer.n_gpus_per_node / trainer.nnodes)."
        )


def count_parameters(hf_config, trust_remote_code: bool = False) -> tuple[int, int]:
    """``(parameters, vocab size)`` of the model, counted on the meta device (no memory, no checkpoint read)."""
    import torch

    from easyrl.workers.fsdp_model import build_empty_model

    model = build_empty_model(hf_config, torch.float32, trust_remote_code=trust_remote_code, attn_implementation="sdpa")
    vocab = getattr(getattr(hf_config, "text_config", hf_config), "vocab_size", None) or hf_config.vocab_size
    return sum(p.numel() for p in model.parameters()), int(vocab)


def reward_model_parameters(config: PPOConfig) -> int:
    """Parameters of ``worker.reward.reward_model`` (0 without one), counted on the meta device from its config."""
    rm = config.worker.reward.reward_model
    if not rm.enabled:
        return 0
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    hf_config = AutoConfig.from_pretrained(rm.model_path, trust_remote_code=rm.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(hf_config, trust_remote_code=rm.trust_remote_code)
    return sum(p.numel() for p in model.parameters())
