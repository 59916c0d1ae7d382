"""Pre-flight device-memory estimate: will this run fit on one device, before minutes of loading end in an OOM?

A worker holds, on its one device (the colocated vLLM engine holds 1 / ``worker.rollout.tensor_parallel_size`` of
the model's weights: the tensor-parallel engines shard every layer, embeddings included; the few replicated norms are
not counted apart):

* rollout phase: vLLM's claim, ``gpu_memory_utilization x device memory`` (its weights in the rollout dtype + the KV
  cache in what is left of that claim), beside what the actor and the reference keep resident while vLLM runs: the
  actor's float32 parameter shard and AdamW's two float32 moments (``4 + 8`` bytes per parameter / world size, unless
  ``worker.actor.offload.offload_params``) and the reference's shard in the compute dtype (unless
  ``worker.ref.offload.offload_params``);
* training phase: vLLM asleep (level 2: ~0), the actor's shard + float32 gradients (resident from the second
  micro-batch of a mini-batch on) + AdamW moments, the reference, and what one update micro-batch of ``T`` tokens
  (``worker.actor.max_token_len_per_device``, else ``micro x (max_prompt_length + max_response_length)``) adds at
  its peak, in the middle of backward (``easyrl simulate`` measured it, category by category; docs/simulate.md):

  - checkpointed activations: gradient checkpointing keeps each decoder layer's input, ``layers x T x hidden``;
  - one layer's activations, recomputed for its backward: ``T x (5 x intermediate + 7 x hidden)`` (gate, up, their
    activation and product; attention, norms in float32), all ``layers`` of them without checkpointing, and the
    transients of that layer's backward, ``T x (intermediate + 4 x hidden)``;
  - FSDP2's unsharded weights: the root group (embedding, and the LM head unless tied) gathered in the compute dtype
    for the whole step, one decoder layer gathered with its unsharded gradients (compute dtype, then float32 for the
    reduce-scatter), and the LM head's unsharded gradient;
  - the logits: none with ``padding_free`` (the fused head, ``easyrl.models.fused_head``, holds 512-token chunks;
    their peak is below the one above); padded, ``micro x (response_length + 1) x vocab`` twice (with the gradient).

  With :class:`ModelShape` omitted (no layer count and widths) only the states and the padded logits are counted.

On-policy distillation's teacher (``worker.teacher``, its own parameter count) adds its shard in the compute dtype to
both phases, unless ``worker.teacher.offload.offload_params`` (the default) keeps it on the host between its passes.

With LoRA (``worker.actor.model.lora.rank > 0``) the base weights are frozen: no gradients or AdamW moments for them
(the adapter's own, typically < 1% of the parameters, are not counted) and no reference copy (the reference policy is
the base with the adapter disabled).

With an LLM judge (``worker.reward.judge``), its engine's claim (``judge.gpu_memory_utilization x device memory``) in
both phases: it has no sleep mode beside the rollout engine (``easyrl.workers.judge``). Its judge phase (the rollout
engine asleep) needs less than the rollout phase.
A reward model (``worker.reward.reward_model``) adds its shard in the compute dtype to both phases unless
``worker.reward.reward_model.offload.offload_params`` (the default, as the reference's).

Experience forwards (old log-probs, reference, the teacher's, the reward model's; vLLM asleep): each a phase of its
own, :func:`estimate_experience` (what stays resident + the role's gathered weights + one layer's no-grad
activations), checked by :func:`check_memory` naming the setting that sizes its micro-batch.

Not counted: CUDA context and NCCL buffers (~1-2 GiB), allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from easyrl.config import PPOConfig
from easyrl.errors import ConfigError
from easyrl.workers.roles import builds_reference, uses_lora

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelShape:
    """The widths that size activations (from the model's ``config.json``; its ``text_config`` for VL models).

    ``intermediate_size`` is the MLP width one token passes through: ``num_experts_per_tok x moe_intermediate_size``
    for a mixture of experts. ``tied``: the LM head is the input embedding (one ``vocab x hidden`` matrix)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    tied: bool
    routed_width: int = 0
    """Mixture of experts: ``num_experts_per_tok x hidden_size``, the width of the token copies routed to the
    experts (0: dense)."""
    linear_value_width: int = 0
    """Gated DeltaNet (linear attention, Qwen3.5): ``linear_num_value_heads x linear_value_head_dim`` (0: none)."""


def model_shape(hf_config) -> ModelShape:
    """:class:`ModelShape` of a Hugging Face config (reads attributes only)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    moe = getattr(text, "moe_intermediate_size", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    width = moe * top_k + (getattr(text, "shared_expert_intermediate_size", None) or 0) if moe and top_k \
        else text.intermediate_size
    tied = getattr(hf_config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
    routed = int(top_k) * int(text.hidden_size) if moe and top_k else 0
    heads, head_dim = getattr(text, "linear_num_value_heads", None), getattr(text, "linear_value_head_dim", None)
    linear = int(heads) * int(head_dim) if heads and head_dim else 0
    return ModelShape(int(text.hidden_size), int(text.num_hidden_layers), int(width), bool(tied), routed, linear)


@dataclass
class MemoryEstimate:
    """GiB per device, item by item, for the two phases of a step, and the device's capacity."""

    capacity_gib: float
    vllm_weights_gib: float
    tensor_parallel_size: int
    vllm_claim_gib: float
    rollout: dict[str, float] = field(default_factory=dict)
    training: dict[str, float] = field(default_factory=dict)
    experience: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each experience forward (``easyrl simulate``'s phase name -> its items, GiB): :func:`estimate_experience`."""

    @property
    def rollout_gib(self) -> float:
        return sum(self.rollout.values())

    @property
    def training_gib(self) -> float:
        return sum(self.training.values())


def estimate_memory(num_params: int, vocab_size: int, config: PPOConfig, capacity_gib: float,
                    shape: ModelShape | None = None, reward_model_params: int = 0,
                    teacher_params: int = 0) -> MemoryEstimate:
    """The per-device estimate for ``config`` (see the module docstring for what is counted).

    Args:
        num_params: parameters of the model (embeddings counted once when tied).
        vocab_size: rows of the output layer (logits width).
        config: the finalized run configuration (world size, offload, dtypes, micro-batch, lengths).
        capacity_gib: total memory of one device, GiB.
        shape: the model's widths (:func:`model_shape`); None leaves the update's activations and unsharded weights
            out (a lower bound).
        reward_model_params: parameters of the reward model (0: none; :func:`reward_model_parameters`).
        teacher_params: parameters of the distillation teacher (``worker.teacher``; 0: none).
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
    logits = 0.0 if actor.padding_free else \
        2 * micro * (config.data.max_response_length + 1) * vocab_size * compute_bytes / GIB
    update = update_activations(num_params, vocab_size, config, shape) if shape is not None else {}
    if shape is not None:
        update["prefetched layer (FSDP2 backward)"] = prefetched_layer(num_params, vocab_size, shape, compute_bytes)
    # PPO with GAE: the critic is a second trained copy (fp32 params, grads, Adam), without the vocabulary-wide logits
    critic_on_device = config.algorithm.needs_critic and not worker.critic.offload.offload_params
    critic = 12 * shard / GIB if critic_on_device else 0.0
    critic_grads = 4 * shard / GIB if critic_on_device else 0.0
    rm = worker.reward.reward_model  # frozen, in the compute dtype, resident unless offloaded
    reward_model = 0.0 if rm.offload.offload_params else DTYPE_BYTES[rm.param_dtype] * reward_model_params / world / GIB
    teacher_on_device = config.algorithm.needs_teacher and not worker.teacher.offload.offload_params
    teacher = compute_bytes * teacher_params / world / GIB if teacher_on_device else 0.0
    teacher_items = {"teacher": teacher} if config.algorithm.needs_teacher else {}  # an item only where one is built
    estimate = MemoryEstimate(
        capacity_gib=capacity_gib,
        vllm_weights_gib=num_params * DTYPE_BYTES[worker.rollout.dtype] / GIB / worker.rollout.tensor_parallel_size,
        tensor_parallel_size=worker.rollout.tensor_parallel_size,
        vllm_claim_gib=claim,
        rollout={"vLLM (gpu_memory_utilization)": claim, "actor params": params, "actor Adam states": adam_in_rollout,
                 "reference": reference, "critic params + Adam states": critic} | teacher_items,
        training={"actor params": params, "actor grads": grads, "actor Adam states": adam, "reference": reference,
                  "logits (one micro-batch)": logits, "critic params + grads + Adam states": critic + critic_grads,
                  **update} | teacher_items,
    )
    judge = worker.reward.judge
    if judge.model_path is not None:  # the LLM judge's engine stays resident (easyrl.workers.judge: no sleep mode)
        for phase in (estimate.rollout, estimate.training):
            phase["judge vLLM (worker.reward.judge.gpu_memory_utilization)"] = judge.gpu_memory_utilization * \
                capacity_gib
    if reward_model_params:
        estimate.rollout["reward model"] = estimate.training["reward model"] = reward_model
    return estimate


def update_activations(num_params: int, vocab_size: int, config: PPOConfig, shape: ModelShape) -> dict[str, float]:
    """GiB that one actor update micro-batch adds at its peak (module docstring), by category."""
    actor = config.worker.actor
    cb = DTYPE_BYTES[actor.fsdp.param_dtype]
    tokens = actor.max_token_len_per_device or \
        actor.micro_batch_size_per_device_for_update * (config.data.max_prompt_length + config.data.max_response_length)
    # what backward needs of one layer (gate, up, their activation and product; attention, norms in float32), and
    # the transients of its own backward on top
    kept = tokens * (5 * shape.intermediate_size + 7 * shape.hidden_size) * cb
    # mixture of experts: the routed token copies (each token's hidden state gathered for each of its top-k experts,
    # and the experts' outputs before the weighted index_add), beside the dense formula's k x moe_intermediate width;
    # easyrl simulate measured 50-55 KB/token on one Qwen3-VL-30B-A3B layer (4096 / 8192 tokens), this counts 64
    kept += tokens * 2 * shape.routed_width * cb
    # Gated DeltaNet: transformers' chunked delta rule runs in float32 (q, k, v copies, the 64-token chunks'
    # attention and decay masks, the recurrent state saved per chunk for backward): easyrl simulate measured one
    # Qwen3.5-27B linear-attention layer at 401 KB/token above a dense layer (4096 tokens; 462 at 8192), ~16 float32
    # value-width vectors per token. The FLA kernel on a GPU needs less: an upper bound there.
    kept += tokens * 16 * shape.linear_value_width * 4
    transient = tokens * (shape.intermediate_size + 4 * shape.hidden_size) * cb
    checkpointing = actor.fsdp.enable_gradient_checkpointing
    embeddings = (1 if shape.tied else 2) * vocab_size * shape.hidden_size
    layer_params = max(num_params - embeddings, 0) / shape.num_layers
    # root group gathered + one layer gathered, its unsharded grads (compute dtype, float32 for the reduce-scatter)
    # + the LM head's unsharded gradient; with LoRA the base is frozen: its weights are gathered, no gradients
    grads = 0 if uses_lora(config) else layer_params * (cb + 4) + vocab_size * shape.hidden_size * cb
    unsharded = embeddings * cb + layer_params * cb + grads
    return {"activations (checkpointed inputs)":
            shape.num_layers * tokens * shape.hidden_size * cb / GIB if checkpointing else 0.0,
            "activations (layers in backward)": ((1 if checkpointing else shape.num_layers) * kept + transient) / GIB,
            "unsharded weights + grads (FSDP2)": unsharded / GIB}


@dataclass(frozen=True)
class RoleModel:
    """A model an experience forward runs (the actor, the teacher, the reward model): its parameter count, its
    vocabulary, its widths, and whether it ends in an LM head (a reward model's score head is ``hidden x 1``)."""

    params: int
    vocab_size: int
    shape: ModelShape
    lm_head: bool = True


EXPERIENCE_SETTINGS = {
    "old log-probs (forward)": "worker.actor.micro_batch_size_per_device_for_experience (or "
                               "worker.actor.max_token_len_per_device with dynamic_batching)",
    "reference forward": "worker.actor.micro_batch_size_per_device_for_experience (or "
                         "worker.actor.max_token_len_per_device with dynamic_batching)",
    "teacher forward": "worker.teacher.micro_batch_size_per_device_for_experience (or "
                       "worker.actor.max_token_len_per_device with dynamic_batching)",
    "reward model forward": "worker.reward.reward_model.micro_batch_size_per_device / max_token_len_per_device / "
                            "max_length",
}
"""The setting that sizes each experience forward's micro-batch (``easyrl simulate``'s phase names)."""


def forward_activations(tokens: int, shape: ModelShape, compute_bytes: int) -> float:
    """Bytes one micro-batch of ``tokens`` holds at the peak of a forward without autograd (``torch.no_grad``: each
    layer's activations are freed as the next one runs), inside one decoder layer's MLP: the gate's activation, the
    up projection and their product (``3 x intermediate``) beside the residual stream, the normed input and the
    attention output (``4 x hidden``), in the compute dtype (``easyrl simulate`` snapshot of a Qwen2.5-7B-wide layer
    at 16384 tokens: exactly these tensors). Attention is the fused kernels' (output + log-sum-exp: no ``S^2``
    term, below the MLP's peak). A mixture of experts peaks at its routed token copies instead: four ``top_k x
    hidden`` tensors per token (the inputs gathered per expert, the grouped matmul's output, the weighted outputs
    before and after the un-permute: the snapshot of a Qwen3-VL-30B-A3B layer at 65536 tokens, 8 GiB), above its
    experts' ``3 x top_k x moe_intermediate``. Gated DeltaNet's chunked state, without autograd, stays below the MLP's
    peak (a Qwen3.5-27B snapshot at 65536 tokens peaks in the MLP): not counted here."""
    mlp = max(3 * shape.intermediate_size, 4 * shape.routed_width)
    return tokens * (mlp + 4 * shape.hidden_size) * compute_bytes


def experience_forward(model: RoleModel, tokens: int, compute_bytes: int) -> dict[str, float]:
    """GiB one experience forward of ``model`` over ``tokens`` adds on top of what stays resident, by category:
    FSDP2's gathered weights in the compute dtype (the root group: the embedding, and the LM head unless tied or a
    score head, for the whole forward; two decoder layers, the one running and the next, prefetched) and
    :func:`forward_activations`. The fused LM head (``padding_free``) holds 512-token chunks of logits: below the
    MLP's peak, not counted."""
    shape = model.shape
    embeddings = (2 if model.lm_head and not shape.tied else 1) * model.vocab_size * shape.hidden_size
    layer = max(model.params - embeddings, 0) / shape.num_layers
    return {"gathered weights (FSDP2)": (embeddings + 2 * layer) * compute_bytes / GIB,
            "activations (one layer, no grad)": forward_activations(tokens, shape, compute_bytes) / GIB}


def estimate_experience(estimate: MemoryEstimate, config: PPOConfig, actor: RoleModel,
                        teacher: RoleModel | None = None,
                        reward_model: RoleModel | None = None) -> dict[str, dict[str, float]]:
    """The experience forwards' peaks per device, phase by phase (old log-probs, reference, teacher, reward model),
    each what stays resident while vLLM sleeps (the rollout phase's items less vLLM's claim: the actor's shard and
    AdamW states, the reference, critic, teacher and reward model shards as offloaded or not, the judge's claim)
    plus :func:`experience_forward` of its model at its token budget: the actor's ``max_token_len_per_device`` or
    ``micro_batch_size_per_device_for_experience x (max_prompt_length + max_response_length)`` (the teacher's micro
    with the actor's budget: ``teacher_role_config``), the reward model's ``max_token_len_per_device`` or
    ``micro_batch_size_per_device x (max_length or the padded length)``. Stored in ``estimate.experience`` too.

    Args:
        estimate: :func:`estimate_memory`'s result for ``config``.
        actor: the actor's (and the reference's) model; ``teacher``/``reward_model``: theirs, None without one.
    """
    worker, data = config.worker, config.data
    length = data.max_prompt_length + data.max_response_length
    cb = DTYPE_BYTES[worker.actor.fsdp.param_dtype]
    resident = {name: gib for name, gib in estimate.rollout.items() if name != "vLLM (gpu_memory_utilization)"}
    budget = worker.actor.max_token_len_per_device
    actor_tokens = budget or worker.actor.micro_batch_size_per_device_for_experience * length
    runs = [("old log-probs (forward)", actor, actor_tokens, cb)]  # (phase, model, tokens, compute bytes)
    if builds_reference(config):
        runs.append(("reference forward", actor, actor_tokens, cb))
    if teacher is not None and config.algorithm.needs_teacher:
        runs.append(("teacher forward", teacher,
                     budget or worker.teacher.micro_batch_size_per_device_for_experience * length, cb))
    rm = worker.reward.reward_model
    if reward_model is not None and rm.enabled:
        tokens = rm.max_token_len_per_device if rm.dynamic_batching and rm.max_token_len_per_device else \
            rm.micro_batch_size_per_device * (rm.max_length or length)
        runs.append(("reward model forward", reward_model, tokens, DTYPE_BYTES[rm.param_dtype]))
    estimate.experience = {phase: resident | {f"{phase}: {item}": gib for item, gib in
                                              experience_forward(model, tokens, nbytes).items()}
                           for phase, model, tokens, nbytes in runs}
    return estimate.experience


def prefetched_layer(num_params: int, vocab_size: int, shape: ModelShape, compute_bytes: int) -> float:
    """GiB of the decoder layer FSDP2 gathers ahead in backward (its all-gather output, the compute dtype, one
    flat ``layer parameters`` buffer), beside the layer whose gradients are being reduce-scattered: the backward
    prefetch. ``easyrl simulate``'s snapshot at the update's peak (Qwen3-VL-30B-A3B, 4 layers, offloaded) holds it,
    1.16 GiB of 623M bf16 parameters, the 30B-A3B recipe's -13% gap (a MoE layer is large beside its activations)."""
    embeddings = (1 if shape.tied else 2) * vocab_size * shape.hidden_size
    return max(num_params - embeddings, 0) / shape.num_layers * compute_bytes / GIB


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
    for phase, items in e.experience.items():  # estimate_experience: vLLM asleep, one micro-batch's forward
        if sum(items.values()) > cap:
            raise ConfigError(
                f"The experience phase '{phase}' needs ~{sum(items.values()):.1f} GiB per device but it has "
                f"{cap:.1f} GiB ({_items(items)} GiB): lower {EXPERIENCE_SETTINGS[phase]}, set {offload}, or use "
                "more devices (trainer.n_gpus_per_node / trainer.nnodes)."
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
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(rm.model_path, trust_remote_code=rm.trust_remote_code)
    return _classifier_parameters(hf_config, rm.trust_remote_code)


def _classifier_parameters(hf_config, trust_remote_code: bool) -> int:
    """Parameters of ``AutoModelForSequenceClassification`` built from ``hf_config`` on the meta device."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(hf_config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())


def experience_models(config: PPOConfig, folder: Callable[[str], str] = str) -> dict[str, RoleModel | None]:
    """:func:`estimate_experience`'s ``teacher`` and ``reward_model`` (None without one), counted on the meta device
    from their ``config.json`` (``folder(model_path)``: ``easyrl simulate`` maps a hub id to the shipped config)."""
    from transformers import AutoConfig

    worker = config.worker
    models: dict[str, RoleModel | None] = {"teacher": None, "reward_model": None}
    if config.algorithm.needs_teacher:
        teacher = worker.teacher.model
        hf_config = AutoConfig.from_pretrained(folder(teacher.model_path), trust_remote_code=teacher.trust_remote_code)
        models["teacher"] = RoleModel(*count_parameters(hf_config, teacher.trust_remote_code), model_shape(hf_config))
    rm = worker.reward.reward_model
    if rm.enabled:
        hf_config = AutoConfig.from_pretrained(folder(rm.model_path), trust_remote_code=rm.trust_remote_code)
        vocab = getattr(getattr(hf_config, "text_config", hf_config), "vocab_size", None) or hf_config.vocab_size
        models["reward_model"] = RoleModel(_classifier_parameters(hf_config, rm.trust_remote_code), int(vocab),
                                           model_shape(hf_config), lm_head=False)
    return models
