"""Pre-flight device-memory estimate: GiB per device for the rollout phase, the training phase and each experience
forward, GiB of host memory per node for what is offloaded (docs/simulate.md, "What the estimate counts"; CUDA
context, NCCL buffers and fragmentation are not counted)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from easyrl.config import PPOConfig
from easyrl.config.actor import teachers_of
from easyrl.config.worker import TRANSFER_BUCKETS_IN_FLIGHT
from easyrl.errors import ConfigError
from easyrl.sizing.anatomy import DTYPE_BYTES, GIB, ModelShape, model_anatomy, split_parameters
from easyrl.sizing.experience import RoleModel, estimate_experience, experience_models
from easyrl.sizing.vision import vision_activations

logger = logging.getLogger("easyrl.worker")

VLLM = "vLLM (gpu_memory_utilization)"
JUDGE = "judge vLLM (worker.reward.judge.gpu_memory_utilization)"
TRANSFER = "weight transfer (buckets + a layer's reload)"
"""The item of the LLM judge's engine, resident beside every phase (no sleep mode)."""


@dataclass
class MemoryEstimate:
    """GiB per device, item by item, for the phases of a step, and the device's capacity. ``rollout_devices`` > 0
    (``trainer.rollout_mode`` other than ``colocated``): the engines run on that many devices of their own, so the
    rollout phase is theirs (the engine alone) and the training and experience phases the trainer's (no engine)."""

    capacity_gib: float
    vllm_weights_gib: float
    tensor_parallel_size: int
    vllm_claim_gib: float
    rollout: dict[str, float] = field(default_factory=dict)
    training: dict[str, float] = field(default_factory=dict)
    resident: dict[str, float] = field(default_factory=dict)
    """What the trainer's devices hold between phases (colocated: beside the engine, in the rollout phase)."""
    experience: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each experience forward's items (phase name -> GiB), ``estimate_experience``."""
    host: dict[str, float] = field(default_factory=dict)
    """Host memory per node (GiB) for the offloaded shards and AdamW states."""
    rollout_devices: int = 0
    judge_weights_gib: float = 0.0
    """The LLM judge's engine weights in ``worker.rollout.dtype`` (one engine per device; 0: no judge)."""

    @property
    def rollout_gib(self) -> float:
        return sum(self.rollout.values())

    @property
    def training_gib(self) -> float:
        return sum(self.training.values())

    def phases(self, side: str = "trainer") -> dict[str, dict[str, float]]:
        """The phases (name -> items) on the devices of ``side``: ``rollout`` (the engines) or ``trainer``; every
        phase when colocated (one set of devices)."""
        rollout = {"The rollout phase": self.rollout}
        if self.rollout_devices and side == "rollout":
            return rollout
        trainer = {"The training phase": self.training}
        trainer |= {f"The experience phase '{phase}'": items for phase, items in self.experience.items()}
        return trainer if self.rollout_devices else rollout | trainer


def estimate_memory(num_params: int, vocab_size: int, config: PPOConfig, capacity_gib: float,
                    shape: ModelShape | None = None, reward_model_params: int = 0,
                    teacher_params: Sequence[int] = (), judge_params: int = 0) -> MemoryEstimate:
    """The per-device estimate for ``config``. ``num_params`` counts tied embeddings once; ``vocab_size`` is the
    logits width; ``capacity_gib`` one device's memory (GiB); ``shape`` None leaves the update's activations out (a
    lower bound); ``reward_model_params``, ``judge_params``: 0 for none; ``teacher_params``: each teacher's, in
    ``teachers_of`` order (each resident beside the actor unless offloaded, item ``<label>``)."""
    worker, actor, world = config.worker, config.worker.actor, config.world_size
    shard = num_params / world
    compute_bytes = DTYPE_BYTES[actor.fsdp.param_dtype]
    actor_on_device = not actor.offload.offload_params
    lora = config.uses_lora  # frozen base: no grads/Adam for it, and the reference is the base itself
    ref_on_device = config.builds_reference and not worker.ref.offload.offload_params
    # stored weights in fsdp.torch_dtype (fp32 by default); adamw_bf16 moments take 2 bytes each
    param_bytes = DTYPE_BYTES[actor.fsdp.torch_dtype] if actor.fsdp.torch_dtype else 4
    moment_bytes = 2 if actor.optim.strategy == "adamw_bf16" else param_bytes
    params = param_bytes * shard / GIB if actor_on_device else 0.0
    adam = 2 * moment_bytes * shard / GIB if actor_on_device and not lora else 0.0
    adam_in_rollout = 0.0 if actor.offload.offload_optimizer else adam  # offload_optimizer: on the host until update
    ref_gib = compute_bytes * shard / GIB
    reference = ref_gib if ref_on_device else 0.0
    claim = worker.rollout.gpu_memory_utilization * capacity_gib
    logits = 0.0 if actor.padding_free else 2 * actor.micro_batch_size_per_device_for_update * \
        (config.data.max_response_length + 1) * vocab_size * compute_bytes / GIB
    update = update_activations(num_params, vocab_size, config, shape) if shape is not None else {}
    # PPO with GAE: the critic is a second trained copy (fp32 params, grads, Adam), without the vocabulary-wide logits
    critic_on_device = config.algorithm.needs_critic and not worker.critic.offload.offload_params
    critic = 12 * shard / GIB if critic_on_device else 0.0
    rm = worker.reward.reward_model  # frozen, in the compute dtype, resident unless offloaded
    rm_gib = DTYPE_BYTES[rm.param_dtype] * reward_model_params / world / GIB
    teachers = list(zip(teachers_of(worker), teacher_params)) if config.algorithm.needs_teacher else []
    teacher_gib = {t.label: compute_bytes * n / world / GIB for t, n in teachers}  # each shard, compute dtype
    beside = {t.label: 0.0 if t.offload.offload_params else teacher_gib[t.label] for t, _ in teachers}
    if worker.reward.judge.model_path is not None:  # the LLM judge's engine stays resident (no sleep mode)
        beside[JUDGE] = worker.reward.judge.gpu_memory_utilization * capacity_gib
    if reward_model_params:
        beside["reward model"] = 0.0 if rm.offload.offload_params else rm_gib
    resident = {"actor params": params, "actor Adam states": adam_in_rollout, "reference": reference,
                "critic params + Adam states": critic} | beside
    split = config.placement.split  # the engines on devices of their own: nothing beside them
    estimate = MemoryEstimate(
        capacity_gib=capacity_gib,
        vllm_weights_gib=num_params * DTYPE_BYTES[worker.rollout.dtype] / GIB / worker.rollout.tensor_parallel_size,
        tensor_parallel_size=worker.rollout.tensor_parallel_size,
        vllm_claim_gib=claim,
        rollout={VLLM: claim} | ({TRANSFER: transfer_gib(num_params, shape, worker.rollout)} if split else resident),
        training={"actor params": params, "actor grads": 0.0 if lora else params, "actor Adam states": adam,
                  "reference": reference, "logits (one micro-batch)": logits,
                  "critic params + grads + Adam states": critic * 16 / 12, **update} | beside,
        resident=resident,
        rollout_devices=config.placement.engine_devices,
        judge_weights_gib=judge_params * DTYPE_BYTES[worker.rollout.dtype] / GIB,
    )
    actor_bytes = param_bytes * (1 if lora else 2) + (0 if lora else 2 * moment_bytes)  # params, grads, AdamW
    host = {"actor params + grads + Adam states": 0.0 if actor_on_device else actor_bytes * shard / GIB,
            "actor Adam states (offload_optimizer)": adam - adam_in_rollout,
            "reference": ref_gib if config.builds_reference and not ref_on_device else 0.0,
            "critic": 16 * shard / GIB if config.algorithm.needs_critic and not critic_on_device else 0.0,
            **{t.label: teacher_gib[t.label] for t, _ in teachers if t.offload.offload_params},
            "reward model": rm_gib if rm.offload.offload_params else 0.0}
    estimate.host = {name: gib * config.trainer.n_gpus_per_node for name, gib in host.items() if gib > 0}
    return estimate


def transfer_gib(num_params: int, shape: ModelShape | None, rollout: Any) -> float:
    """GiB a split placement's rollout device holds beside vLLM's claim while new weights arrive
    (``easyrl.workers.weight_transfer.receive``; device review 2026-12-02, S3-N10): the received flat buckets
    (``TRANSFER_BUCKETS_IN_FLIGHT`` of ``rollout.update_weights_bucket_megabytes``, or of the largest tensor where it
    is larger, since a bucket holds whole tensors; at most the whole model) and one decoder layer's tensors, which
    vLLM's layer-wise reload materialises in the load format, all in ``rollout.dtype``. ``shape`` None (not
    counted): the buckets alone."""
    itemsize = DTYPE_BYTES[rollout.dtype]
    largest, layer = (shape.largest_tensor, shape.largest_layer) if shape is not None else (0, 0)
    bucket = max(rollout.update_weights_bucket_megabytes * 2**20, largest * itemsize)
    return (min(num_params * itemsize, TRANSFER_BUCKETS_IN_FLIGHT * bucket) + layer * itemsize) / GIB


def estimate_run(config: PPOConfig, capacity_gib: float, folder: Callable[[str], str] = str) -> MemoryEstimate:
    """The whole estimate of ``config`` on devices of ``capacity_gib`` GiB (the worker's pre-flight and ``easyrl
    simulate`` call it): every role's anatomy, both phases and every experience forward; ``folder(model_path)`` finds
    each ``config.json``."""
    from transformers import AutoConfig

    model = config.worker.actor.model
    hf_config = AutoConfig.from_pretrained(folder(model.model_path), trust_remote_code=model.trust_remote_code)
    actor = RoleModel(*model_anatomy(hf_config, model.trust_remote_code))
    roles = experience_models(config, folder)
    params: dict = {"teacher_params": [teacher.params for teacher in roles["teachers"]]}
    if roles["reward_model"] is not None:
        params["reward_model_params"] = roles["reward_model"].params
    judge = config.worker.reward.judge.model_path
    if judge is not None:  # its engine's weights, checked against its claim
        params["judge_params"] = model_anatomy(AutoConfig.from_pretrained(folder(judge)))[0]
    estimate = estimate_memory(actor.params, actor.vocab_size, config, capacity_gib, actor.shape, **params)
    estimate_experience(estimate, config, actor, **roles)
    return estimate


def update_activations(num_params: int, vocab_size: int, config: PPOConfig, shape: ModelShape) -> dict[str, float]:
    """GiB that one actor update micro-batch adds at its peak, in the middle of backward, by category."""
    actor = config.worker.actor
    cb = DTYPE_BYTES[actor.fsdp.param_dtype]
    tokens = config.token_budget(actor.micro_batch_size_per_device_for_update)
    # what backward needs of one layer (gate, up, their activation and product; attention, norms in float32), and
    # the transients of its own backward on top
    kept = tokens * (5 * shape.intermediate_size + 7 * shape.hidden_size) * cb
    # mixture of experts: the routed token copies (each token's hidden state gathered for each of its top-k experts,
    # and the experts' outputs before the weighted index_add), beside the dense formula's k x moe_intermediate width
    kept += tokens * 2 * shape.routed_width * cb
    # Gated DeltaNet: transformers' chunked delta rule runs in float32 (q, k, v copies, the 64-token chunks'
    # attention and decay masks, the recurrent state saved per chunk for backward), ~16 float32 value-width vectors
    # per token (docs/simulate.md has both measurements). The FLA kernel on a GPU needs less: an upper bound there.
    kept += tokens * 16 * shape.linear_value_width * 4
    transient = tokens * (shape.intermediate_size + 4 * shape.hidden_size) * cb
    checkpointing = actor.fsdp.enable_gradient_checkpointing
    embeddings, layer_params = split_parameters(num_params, vocab_size, shape)
    # root group gathered + one layer gathered, its unsharded grads (compute dtype, float32 for the reduce-scatter)
    # + the LM head's unsharded gradient; with LoRA the base is frozen: its weights are gathered, no gradients
    grads = 0 if config.uses_lora else layer_params * (cb + 4) + vocab_size * shape.hidden_size * cb
    unsharded = embeddings * cb + layer_params * cb + grads
    vision = vision_activations(config, shape.vision) if shape.vision is not None else {}
    # routing replay: the micro-batch's routed_experts, int16 per token x layer x top-k, padded and packed
    top_k = shape.routed_width // shape.hidden_size
    routing = 2 * tokens * shape.num_layers * top_k * 2 if actor.router_replay.enabled else 0
    return ({"replayed routing (R2/R3)": routing / GIB} if routing else {}) | {
            "activations (checkpointed inputs)":
            shape.num_layers * tokens * shape.hidden_size * cb / GIB if checkpointing else 0.0,
            "activations (layers in backward)": ((1 if checkpointing else shape.num_layers) * kept + transient) / GIB,
            "unsharded weights + grads (FSDP2)": unsharded / GIB,
            "prefetched layer (FSDP2 backward)": layer_params * cb / GIB} | vision


BUDGET = " (or worker.actor.max_token_len_per_device with dynamic_batching)"
EXPERIENCE_SETTINGS = {
    "old log-probs (forward)": "worker.actor.micro_batch_size_per_device_for_experience" + BUDGET,
    "reference forward": "worker.actor.micro_batch_size_per_device_for_experience" + BUDGET,
    "teacher": "worker.teacher.micro_batch_size_per_device_for_experience" + BUDGET,  # each teacher's forward
    "reward model forward": "worker.reward.reward_model.micro_batch_size_per_device / max_token_len_per_device / "
                            "max_length",
}
"""The setting that sizes each experience forward's micro-batch (``easyrl simulate``'s phase names)."""


MORE_DEVICES = "more devices (trainer.n_gpus_per_node / trainer.nnodes: smaller shards)"
GATHERED = "devices with more memory (FSDP2 gathers the root group and whole layers, whatever the world size)"
UPDATE = "worker.actor.micro_batch_size_per_device_for_update"
ADVICE = {  # item name part -> what shrinks it (the first match wins); "offload" ones shrink with more devices too
    "teacher ": "its worker.teachers.<name>.offload.offload_params=true",  # one of several: "teacher <name>" (first:
    # a teacher's name may hold another item's word)
    "judge vLLM": "lower worker.reward.judge.gpu_memory_utilization",
    "weight transfer": "a lower worker.rollout.update_weights_bucket_megabytes or "
                       "worker.rollout.gpu_memory_utilization",
    "vLLM": "lower worker.rollout.gpu_memory_utilization", "actor": "worker.actor.offload.offload_params=true",
    "reference": "worker.ref.offload.offload_params=true", "critic": "worker.critic.offload.offload_params=true",
    "teacher": "worker.teacher.offload.offload_params=true",
    "reward model": "worker.reward.reward_model.offload.offload_params=true",
    "logits": f"worker.actor.padding_free=true (no full logits) or a lower {UPDATE}",
    "vision tower (update": f"a lower data.max_pixels or {UPDATE}",
    "activations": f"a lower {UPDATE} (or worker.actor.max_token_len_per_device), or a higher "
                   "worker.actor.ulysses_size (each sequence split over that many devices)",
    "FSDP2": GATHERED, "first decoder layer": GATHERED}


def advice(items: dict[str, float], excess_gib: float) -> str:
    """What to change for a phase ``excess_gib`` over the device: the settings (:data:`ADVICE`,
    :data:`EXPERIENCE_SETTINGS`) of its largest items until they cover the excess, and of any holding a fifth."""
    total = sum(items.values())
    ranked = sorted(((gib, name) for name, gib in items.items() if gib > 0), reverse=True)
    steps, covered, devices = [], 0.0, False
    for gib, name in ranked:
        if covered >= excess_gib and gib < total / 5:
            break
        covered += gib
        phase, _, item = name.rpartition(": ")
        step = next((a for part, a in ADVICE.items() if part in item), None)
        setting = next((s for forward, s in EXPERIENCE_SETTINGS.items() if phase.startswith(forward)), None)
        if setting and step != GATHERED:  # the forward's own activations and inputs
            step = f"a lower {setting}"
        step = step or GATHERED
        devices |= "offload" in step
        steps += [step] if step not in steps else []
    return "; ".join(steps + [MORE_DEVICES] * devices)


def check_memory(estimate: MemoryEstimate, side: str = "trainer") -> None:
    """Stop a run that cannot fit on the devices of ``side`` (``MemoryEstimate.phases``), naming every phase that
    does not with its numbers and :func:`advice`. Raises ``ConfigError``: vLLM's weights do not fit in its claim (no
    room for a KV cache), or a phase needs more than the device has."""
    e = estimate
    cap = e.capacity_gib
    problems = []
    phases = e.phases(side)
    if "The rollout phase" in phases and e.vllm_weights_gib >= e.vllm_claim_gib:
        problems.append(
            f"vLLM's weights ({e.vllm_weights_gib:.1f} GiB in worker.rollout.dtype) do not fit in its share of the "
            f"device, worker.rollout.gpu_memory_utilization x {cap:.1f} GiB = {e.vllm_claim_gib:.1f} GiB, leaving no "
            "KV cache: raise worker.rollout.tensor_parallel_size (now "
            f"{e.tensor_parallel_size}) to split each engine's weights over more devices, raise "
            "worker.rollout.gpu_memory_utilization (offloading what the rollout phase holds beside it), or use "
            "devices with more memory.")
    if e.judge_weights_gib and "The training phase" in phases and e.judge_weights_gib >= e.training[JUDGE]:
        problems.append(
            f"The judge's vLLM weights ({e.judge_weights_gib:.1f} GiB in worker.rollout.dtype) do not fit in its "
            f"share, worker.reward.judge.gpu_memory_utilization x the device = {e.training[JUDGE]:.1f} GiB, leaving "
            "no KV cache: raise worker.reward.judge.gpu_memory_utilization (and lower "
            "worker.rollout.gpu_memory_utilization), or choose a smaller judge model.")
    for phase, items in phases.items():  # experience forwards: vLLM asleep, one micro-batch's forward
        need = sum(items.values())
        if need > cap:
            listed = ", ".join(f"{name} {gib:.1f}" for name, gib in items.items() if gib > 0)
            problems.append(f"{phase} needs ~{need:.1f} GiB per device but it has {cap:.1f} GiB ({listed} "
                            f"GiB): {advice(items, need - cap)}.")
    if problems:
        raise ConfigError(" ".join(problems))


def preflight(config: PPOConfig, capacity_gib: float, side: str = "trainer", log: bool = True) -> None:
    """A worker's pre-flight before anything is loaded: :func:`estimate_run` on its device, logged (``log``), and
    :func:`check_memory` of its ``side`` (``trainer``: the FSDP2 roles, with the engine when colocated; ``rollout``:
    a split placement's engine alone); ``ConfigError`` with the numbers and the setting to change."""
    estimate = estimate_run(config, capacity_gib)
    if log:
        logger.info("memory per device (GiB of %.1f): rollout %.1f, training %.1f; host per node (offloaded) %.1f",
                    capacity_gib, estimate.rollout_gib, estimate.training_gib, sum(estimate.host.values()))
    check_memory(estimate, side)
