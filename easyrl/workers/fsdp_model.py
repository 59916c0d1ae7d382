"""Loading and sharding a Hugging Face model with FSDP2 (``fully_shard``): where each tensor lives, in which dtype.

Every rank builds the model on the meta device; rank 0 alone reads the checkpoint (host) and broadcasts it. Sharded
parameters (with gradients and Adam states) live on the host only with ``offload_params`` on an accelerator; buffers
always on the compute device; every collective runs on device tensors (NCCL/HCCL take no host tensors). The frozen
reference is held in ``fsdp.param_dtype``, copied from the actor's local shards.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate

from easyrl.config import ActorConfig, FSDPConfig, OffloadConfig
from easyrl.config.role import DTYPES
from easyrl.device import torch_device
from easyrl.models.hf_folder import hf_model_class, supports_sdpa
from easyrl.models.packed_linear_attention import split_linear_attention_at_sequences

TORCH_DTYPES = {name: getattr(torch, spec.torch_name) for name, spec in DTYPES.items()}


def param_device(device: str, offload_params: bool) -> str:
    """Where a sharded model's parameters (with their gradients and optimizer states) live: on the host only when
    offloading from an accelerator, else on ``device``. Raises ``ValueError`` for an unknown device kind."""
    if device not in ("cuda", "npu", "cpu"):
        raise ValueError(f"Unknown device kind '{device}' (expected cuda, npu or cpu).")
    return "cpu" if offload_params and device != "cpu" else device


def stored_dtype(fsdp: FSDPConfig, trainable: bool) -> torch.dtype:
    """The dtype the sharded parameters are held in: a trained role's in ``fsdp.torch_dtype`` (None: float32), a
    frozen role's in the compute dtype ``fsdp.param_dtype``."""
    if not trainable:
        return TORCH_DTYPES[fsdp.param_dtype]
    return TORCH_DTYPES[fsdp.torch_dtype] if fsdp.torch_dtype is not None else torch.float32


def frozen_towers(model: Any) -> list[Any]:
    """The modules ``freeze_vision_tower`` freezes: the family's vision tower (``easyrl.models.families.vision_parts``:
    ``model.visual`` for Qwen-VL, ``model.vision_tower`` for InternVL, ...); its projector beside it stays trained.
    Empty for a text model (refused before Ray, ``easyrl.trainer.model_parts.check_tower_freeze``)."""
    from easyrl.models.families import vision_parts

    return [model.get_submodule(path) for path in vision_parts(model)[0]]


def build_empty_model(hf_config, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str,
                      device: str = "cpu"):
    """The model's modules on the meta device, parameters of ``dtype``. On ``npu`` MoE experts run transformers'
    ``eager`` loop (torch_npu has no ``torch._grouped_mm`` kernel: docs/ascend.md)."""
    kwargs = dict(dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)
    if device == "npu":
        kwargs["experts_implementation"] = "eager"
    with torch.device("meta"):
        return hf_model_class(hf_config).from_config(hf_config, **kwargs)


def read_checkpoint(model_path: str, hf_config, trust_remote_code: bool, lora: Any = None) -> tuple[dict, dict]:
    """Rank 0 only: the checkpoint's float32 state dict and the model's buffers (``name -> tensor``), on the host,
    read through ``from_pretrained`` so that names match this transformers' model class. With ``lora`` the model is
    wrapped first (peft's names, rank 0's fresh adapter with B = 0)."""
    attn = "sdpa" if supports_sdpa(hf_config) else "eager"  # only the weights are read
    model = hf_model_class(hf_config).from_pretrained(model_path, dtype=torch.float32,
                                                      trust_remote_code=trust_remote_code, attn_implementation=attn)
    if lora is not None:
        from easyrl.models.lora import apply_lora

        apply_lora(model, lora, model_path)
    return model.state_dict(), {name: buf.detach().clone() for name, buf in model.named_buffers()}


def load_sharded_model(model_path: str, hf_config, config: ActorConfig, mesh: DeviceMesh, device: str, trainable: bool,
                       offload: OffloadConfig, init_from: Optional[torch.nn.Module] = None,
                       attn_implementation: str = "sdpa",
                       adapt: Optional[Callable[[torch.nn.Module, dict], None]] = None) -> torch.nn.Module:
    """Build one role's FSDP2-sharded model on every rank (collective). ``model_path`` is read on rank 0 only, unless
    the shards are copied from ``init_from`` (a sharded model of the same checkpoint). ``trainable``: float32 master
    parameters, gradient checkpointing, vision-tower freeze and LoRA as configured; else frozen in
    ``fsdp.param_dtype``. ``adapt(meta_model, full_state)`` changes the model before sharding and rank 0's state dict
    to match (``{}`` elsewhere), e.g. the critic's value head."""
    dtype = stored_dtype(config.fsdp, trainable)
    trust = config.model.trust_remote_code
    lora = config.model.lora if trainable and config.model.lora.rank > 0 else None
    full_state, buffers = {}, {}
    if init_from is None and dist.get_rank() == 0:
        full_state, buffers = read_checkpoint(model_path, hf_config, trust, lora)
    model = build_empty_model(hf_config, dtype, trust, attn_implementation, device)
    if adapt is not None:
        adapt(model, full_state)
    if device == "npu" and config.model.npu_fused_kernels:
        from easyrl.models.npu_kernels import apply_npu_fused_kernels

        apply_npu_fused_kernels(model)
    split_linear_attention_at_sequences(model)  # packed rows through Gated DeltaNet (Qwen3.5): one sequence at a time
    if trainable and config.fsdp.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trainable and config.model.freeze_vision_tower:
        for tower in frozen_towers(model):
            tower.requires_grad_(False)
    if not trainable:
        model.requires_grad_(False)
    if lora is not None:
        from easyrl.models.lora import apply_lora

        apply_lora(model, lora, model_path)  # in place: peft's wrapper is not kept (see easyrl.models.lora)
    shard_model(model, mesh, config.fsdp, device, offload.offload_params)
    if init_from is not None:
        copy_shards(init_from, model)
    else:
        broadcast_weights(model, full_state, buffers)
    return model


def shard_model(model: torch.nn.Module, mesh: DeviceMesh, fsdp: FSDPConfig, device: str, offload_params: bool) -> None:
    """Apply FSDP2 ``fully_shard`` to each block (``model._no_split_modules``), then to the whole model, in place
    (compute in ``fsdp.param_dtype``, gradients reduced in ``fsdp.reduce_dtype``), and allocate the meta-device model
    uninitialised: parameters on :func:`param_device`, buffers on ``device``. Raises ``ValueError`` for an unknown
    device kind or a model that declares no transformer block classes."""
    params = param_device(device, offload_params)
    mp_policy = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[fsdp.param_dtype],
                                     reduce_dtype=TORCH_DTYPES[fsdp.reduce_dtype])
    kwargs: dict[str, Any] = dict(mesh=mesh, mp_policy=mp_policy, reshard_after_forward=fsdp.reshard_after_forward)
    if params != device:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} declares no transformer blocks (_no_split_modules) to shard.")
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device=params)  # FSDP2 re-registers (and pins, when offloading) the local shards
    buffer_device = torch_device(device)
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.device != buffer_device:
                module._buffers[name] = buffer.to(buffer_device)


def broadcast_weights(model: torch.nn.Module, full_state: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]):
    """Give every rank its shard of rank 0's checkpoint and broadcast rank 0's buffers in place; ``full_state`` and
    ``buffers`` are ``{}`` on the other ranks."""
    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for name, buffer in model.named_buffers():
        if name in buffers:
            buffer.copy_(buffers[name])
        dist.broadcast(buffer, src=0)
    _restore_original_inv_freq(model)


def _restore_original_inv_freq(model: torch.nn.Module) -> None:
    """HF rotary modules keep ``original_inv_freq`` as a plain attribute (not a buffer): rebuild it from the buffer
    on models that were built on the meta device."""
    for module in model.modules():
        original = getattr(module, "original_inv_freq", None)
        if isinstance(original, torch.Tensor) and (original.is_meta or original.device != module.inv_freq.device):
            module.original_inv_freq = module.inv_freq.clone()


@torch.no_grad()
def copy_shards(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Fill ``dst``'s local shards and buffers from ``src`` (same architecture and mesh), cast to ``dst``'s dtypes;
    no communication. Raises ``ValueError`` when parameter names or local shard shapes differ."""
    src_params, dst_params = dict(src.named_parameters()), dict(dst.named_parameters())
    if src_params.keys() != dst_params.keys():
        differ = sorted(src_params.keys() ^ dst_params.keys())[:5]
        raise ValueError(f"Cannot copy shards between different models: {differ}")
    for name, param in dst_params.items():
        mine, theirs = _local(param), _local(src_params[name])
        if mine.shape != theirs.shape:
            raise ValueError(f"Local shard of '{name}' has shape {tuple(theirs.shape)} vs {tuple(mine.shape)}.")
        mine.copy_(theirs)
    src_buffers = dict(src.named_buffers())
    for name, buffer in dst.named_buffers():
        buffer.copy_(src_buffers[name])
    _restore_original_inv_freq(dst)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gather_full(tensor: torch.Tensor, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The full tensor of a (possibly host-offloaded) shard: the local shard is moved to the compute ``device`` and
    cast to ``dtype`` first (less to send), then all-gathered (collective: every rank must call it). Plain tensors
    are returned moved and cast."""
    moved = tensor.detach().to(device=device, dtype=dtype or tensor.dtype)
    return moved.full_tensor() if isinstance(moved, DTensor) else moved


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float, device: torch.device) -> torch.Tensor:
    """Global L2 norm of the gradients of FSDP2-sharded parameters (before clipping, float32 scalar on ``device``),
    clipped to ``max_norm`` in place as ``torch.nn.utils.clip_grad_norm_`` would on the full model. Local squared
    sums are all-reduced (replicated gradients count once); gradients are scaled by ``min(1, max_norm / (norm +
    1e-6))`` unless the norm is not finite (the caller then skips the step)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    world = dist.get_world_size() if dist.is_initialized() else 1
    local_sq = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        sq = _local(grad).float().pow(2).sum().to(device)
        replicated = not isinstance(grad, DTensor) or all(isinstance(p, Replicate) for p in grad.placements)
        local_sq += sq / world if replicated else sq
    if world > 1:
        dist.all_reduce(local_sq)
    total = local_sq.sqrt()
    if torch.isfinite(total):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            local = _local(grad)
            local.mul_(coef.to(local.device, local.dtype))
    return total


def gather_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of an FSDP2 model on rank 0's host, ``{}`` elsewhere (collective)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
