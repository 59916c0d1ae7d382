"""The experience forwards' memory (old log-probs, reference, each teacher, reward model; vLLM asleep), each a phase:
what stays resident + the larger of the forward's peak and its start (docs/simulate.md, "Experience forwards")."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Callable

from easyrl.config import PPOConfig
from easyrl.config.actor import teachers_of
from easyrl.sizing.anatomy import (
    DTYPE_BYTES,
    GIB,
    ModelShape,
    meta_model,
    model_anatomy,
    model_shape,
    split_parameters,
    vocab_size,
)
from easyrl.sizing.vision import vision_forward, vision_start


@dataclass(frozen=True)
class RoleModel:
    """A model an experience forward runs: parameters, vocabulary, widths, and whether it ends in an LM head."""

    params: int
    vocab_size: int
    shape: ModelShape
    lm_head: bool = True


def forward_peak(config: PPOConfig, model: RoleModel, tokens: int, compute_bytes: int,
                 images: bool) -> dict[str, float]:
    """GiB one experience forward of ``model`` over ``tokens`` adds to what stays resident (docs/simulate.md): the
    larger of its peak in a decoder layer (FSDP2's gathered root group and two decoder layers, one layer's activations
    without autograd at their peak in its MLP, ``3 x intermediate`` or MoE's routed copies ``4 x top_k x hidden``,
    beside ``4 x hidden``; with ``images`` ``vision.vision_forward``) and what it holds before its first block, above
    that for a large vocabulary (the root group twice, unsharded and the all-gather output FSDP2 keeps until the next
    group's, the input embeddings, and the first decoder layer twice or ``vision.vision_start``)."""
    shape = model.shape
    root, layer = (n * compute_bytes / GIB for n in split_parameters(model.params, model.vocab_size, shape,
                                                                      model.lm_head))
    mlp = max(3 * shape.intermediate_size, 4 * shape.routed_width)
    peak = {"gathered weights (FSDP2)": root + 2 * layer,
            "activations (one layer, no grad)": tokens * (mlp + 4 * shape.hidden_size) * compute_bytes / GIB}
    first = {"first decoder layer (gathered, copied out)": 2 * layer}
    if images:
        peak |= vision_forward(config, shape.vision, tokens, shape.hidden_size)
        first = {"vision tower before its first block": vision_start(config, shape.vision, tokens) / GIB}
    start = {"gathered root group (FSDP2)": root,
             "root all-gather output (FSDP2 keeps it until the next group's)": root,
             "input embeddings": tokens * shape.hidden_size * compute_bytes / GIB} | first
    return start if sum(start.values()) > sum(peak.values()) else peak


def estimate_experience(estimate: "MemoryEstimate", config: PPOConfig, actor: RoleModel,
                        teachers: Sequence[RoleModel] = (),
                        reward_model: RoleModel | None = None) -> dict[str, dict[str, float]]:
    """Each experience forward's items (phase name -> GiB), also stored in ``estimate.experience``: what the
    trainer's devices hold between phases (``estimate.resident``) plus :func:`forward_peak` at its token budget.
    ``teachers``: one per teacher in ``teachers_of`` order (each its own forward, ``<label> forward``);
    ``reward_model``: None without one."""
    worker, data = config.worker, config.data
    length = data.max_prompt_length + data.max_response_length
    cb = DTYPE_BYTES[worker.actor.fsdp.param_dtype]
    actor_tokens = config.token_budget(worker.actor.micro_batch_size_per_device_for_experience)
    runs = [("old log-probs (forward)", actor, actor_tokens, cb)]  # (phase, model, tokens, compute bytes)
    if config.builds_reference:
        runs.append(("reference forward", actor, actor_tokens, cb))
    labels = [teacher.label for teacher in teachers_of(worker)] if config.algorithm.needs_teacher else []
    for label, teacher in zip(labels, teachers):  # each at the teachers' one micro-batch
        runs.append((f"{label} forward", teacher,
                     config.token_budget(worker.teacher.micro_batch_size_per_device_for_experience), cb))
    rm = worker.reward.reward_model
    if reward_model is not None and rm.enabled:
        tokens = rm.max_token_len_per_device if rm.dynamic_batching and rm.max_token_len_per_device else \
            rm.micro_batch_size_per_device * (rm.max_length or length)
        runs.append(("reward model forward", reward_model, tokens, DTYPE_BYTES[rm.param_dtype]))
    estimate.experience = {}
    for phase, model, tokens, nbytes in runs:
        images = model.shape.vision is not None and phase != "reward model forward"  # the reward model scores text
        items = forward_peak(config, model, tokens, nbytes, images)
        estimate.experience[phase] = estimate.resident | {f"{phase}: {item}": gib for item, gib in items.items()}
    return estimate.experience


def experience_models(config: PPOConfig, folder: Callable[[str], str] = str) -> dict[str, Any]:
    """:func:`estimate_experience`'s ``teachers`` (a list, empty without distillation) and ``reward_model`` (None
    without one), counted on the meta device from ``folder(model_path)``'s ``config.json``."""
    from transformers import AutoConfig

    worker = config.worker
    models: dict[str, Any] = {"teachers": [], "reward_model": None}
    for teacher in teachers_of(worker) if config.algorithm.needs_teacher else []:
        model = teacher.model
        hf_config = AutoConfig.from_pretrained(folder(model.model_path), trust_remote_code=model.trust_remote_code)
        models["teachers"].append(RoleModel(*model_anatomy(hf_config, model.trust_remote_code)))
    rm = worker.reward.reward_model
    if rm.enabled:
        hf_config = AutoConfig.from_pretrained(folder(rm.model_path), trust_remote_code=rm.trust_remote_code)
        classifier = meta_model(hf_config, rm.trust_remote_code, classifier=True)  # a score head, no LM head
        models["reward_model"] = RoleModel(sum(p.numel() for p in classifier.parameters()), vocab_size(hf_config),
                                           model_shape(hf_config), lm_head=False)
    return models
