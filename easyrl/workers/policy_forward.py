"""The policy's (and the critic's) forward for one padded micro-batch: response log-probs (and entropies), or values.

Two layouts, the same numbers (fp32: within 1e-6, ``tests/test_packing.py``): padding-free (default) packs the
micro-batch into one row (``easyrl.models.packing``) and fuses the lm_head with the log-softmax at the positions that
predict a response token (``easyrl.models.fused_head``); padded keeps the mask and takes the last ``R + 1`` logits.
The critic's ``(tokens, 1)`` value head is read at the same positions.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple, Optional

import torch

from easyrl.algorithms.token_ops import entropy_from_logits, log_probs_from_logits
from easyrl.models.families import family
from easyrl.models.fused_head import FusedLogProbHead
from easyrl.models.packed_attention import PACKED_EAGER, PACKED_SDPA
from easyrl.models.packing import pack_sequences
from easyrl.models.router_replay import NO_EXPERT, RouterReplay
from easyrl.models.ulysses import SequenceParallel

__all__ = ["ModelInputs", "PolicyScores", "response_scores", "response_values", "attention_implementation",
           "flash_attention_warning"]

ROPE_INDEX_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def attention_implementation(device: str, padding_free: bool, param_dtype: str, flash_available: bool,
                             windowed: bool, sdpa: bool = True, chunked: bool = False) -> str:
    """transformers' attention for the policy: ``flash_attention_2`` (varlen) for padding-free bf16/fp16 forwards on
    NPUs and on CUDA with ``flash_attn`` installed; ``PACKED_SDPA`` (one causal SDPA call per packed sequence, its
    sliding window applied) for other padding-free forwards; ``sdpa`` with the mask for padded ones.

    ``windowed``: the model has sliding-window layers (``families.attends_in_windows`` of its config). On NPUs those
    take ``PACKED_SDPA``: transformers' NPU ``flash_attn_varlen_func`` has no ``window_size`` parameter, so the flash
    path would attend over the whole sequence (transformers 5.5.4 and 5.19, ``integrations/npu_flash_attention.py``);
    CUDA's flash-attn takes the window.

    ``chunked``: the model has chunked-attention layers (``families.attends_in_chunks``: Llama 4), which no flash
    kernel takes (transformers' ``create_chunked_causal_mask`` refuses flash attention past one chunk): ``PACKED_SDPA``
    on every device, its chunks applied per sequence.

    ``sdpa`` False (the model class's ``_supports_sdpa``: transformers runs it only with its own eager attention, the
    attention sinks of gpt-oss and its kin): ``PACKED_EAGER`` padding-free on every device (flash-attn 2 has no
    sinks argument), ``eager`` padded."""
    if not sdpa:
        return PACKED_EAGER if padding_free else "eager"
    if not padding_free:
        return "sdpa"
    if chunked:
        return PACKED_SDPA
    varlen = (device == "npu" and not windowed) or (device == "cuda" and flash_available)
    if param_dtype in ("bf16", "fp16") and varlen:
        return "flash_attention_2"
    return PACKED_SDPA


def flash_attention_warning(device: str, padding_free: bool, param_dtype: str, flash_available: bool) -> Optional[str]:
    """The start-up warning for a CUDA run that would use the varlen flash kernel without the ``flash_attn`` package
    (not in the ``gpu`` extra: it builds from source against the local CUDA toolkit); None when nothing is lost."""
    if device != "cuda" or not padding_free or param_dtype not in ("bf16", "fp16") or flash_available:
        return None
    return ("flash_attn is not installed: padding-free forwards on CUDA fall back to one SDPA call per "
            "sequence (correct, slower); install it for the varlen kernel: "
            "pip install flash-attn --no-build-isolation (needs the CUDA toolkit)")


class ModelInputs(NamedTuple):
    """One padded micro-batch on the compute device, as both forwards (policy and critic) take it."""

    input_ids: torch.Tensor
    """``(bsz, P + R)`` left-padded prompts + right-padded responses."""
    attention_mask: torch.Tensor
    """``(bsz, P + R)`` 1 at real tokens."""
    response_mask: torch.Tensor
    """``(bsz, R)`` 1 at response tokens."""
    multi_modal: dict[str, torch.Tensor]
    """Processor outputs of the micro-batch's images (``pixel_values``, ``image_grid_thw``, ...), merged in sample
    order; ``{}`` for text."""
    mm_token_type_ids: Optional[torch.Tensor]
    """``(bsz, P + R)`` 1 at image tokens, 2 at video tokens, 0 elsewhere (Qwen-VL mRoPE), or None for text and for
    families with 1-D positions."""
    routed_experts: Optional[torch.Tensor] = None
    """``(bsz, P + R, layers, top_k)`` the experts the rollout engine routed each token to (``-1``: none), or None
    (no routing replay)."""


class PolicyScores(NamedTuple):
    """What one policy forward of a micro-batch returns."""

    log_probs: torch.Tensor
    """``(bsz, R)`` float32 log-probs of the response tokens, 0 at response padding."""
    entropy: Optional[torch.Tensor]
    """``(bsz, R)`` float32 entropies, or None when not asked for."""
    router_aux_loss: Optional[torch.Tensor]
    """0-dim load-balancing loss of an MoE router over the micro-batch's tokens, or None when not asked for."""
    routing: Optional[torch.Tensor] = None
    """``(bsz, P + R, layers, top_k)`` int16 the experts the forward used per token (``-1`` at padding), laid out
    as ``input_ids``; None unless asked for (``record``: R2's old-log-prob pass)."""


def response_scores(model: torch.nn.Module, inputs: ModelInputs, temperature: float, with_entropy: bool,
                    entropy_grad: bool, fused_head: Optional[FusedLogProbHead] = None, router_aux: bool = False,
                    sp: Optional[SequenceParallel] = None, replay: Optional[RouterReplay] = None,
                    record: bool = False) -> PolicyScores:
    """Log-probs (and entropies, and an MoE router's load-balancing loss) of one micro-batch's response tokens, the
    logits divided by ``temperature``. ``fused_head`` given: the padding-free layout with this head on ``model`` (and
    ``sp``, this rank's sequence-parallel group); None: the padded layout. ``replay``: the model's routers replay
    ``inputs.routed_experts`` (routing replay; their tokens laid out as this layout feeds them); ``record``: and
    ``replay`` returns the experts they used (``PolicyScores.routing``). Raises ``ValueError`` when ``router_aux``
    and the model returned no ``aux_loss`` (not an MoE model)."""
    extra = {"output_router_logits": True} if router_aux else {}
    entropy = None
    routed = inputs.routed_experts
    if record:
        replay.record()
    if fused_head is not None:
        if replay is not None:  # the packed row: each sequence's real tokens, in order (this rank's slice of it)
            replay.arm(None if routed is None else _packed_routing(routed[inputs.attention_mask.bool()], sp))
        packed = _pack(model, inputs)
        scores, output = _packed_forward(
            model, packed, inputs.multi_modal, sp, extra=extra,
            scoring=lambda labels, keep: fused_head.scoring(labels, temperature,
                                                            entropy_grad=entropy_grad and with_entropy, keep=keep))
        log_probs = packed.unpack(scores[:, 0])
        if with_entropy:
            entropy = packed.unpack(scores[:, 1])
            entropy = entropy if entropy_grad else entropy.detach()  # its column was built detached already
    else:
        if replay is not None:  # every padded position, row by row
            replay.arm(None if routed is None else routed.reshape(-1, *routed.shape[2:]))
        output = _padded_outputs(model, inputs, extra)
        # position t predicts token t+1: drop the last of the R + 1 kept positions (the last R + 1 of all positions
        # where the model's forward ignores logits_to_keep: MiniCPM-V 4.6)
        logits = output.logits[:, -inputs.response_mask.shape[1] - 1:-1, :]
        responses = inputs.input_ids[:, -inputs.response_mask.shape[1]:]
        log_probs = log_probs_from_logits(logits, responses, temperature=temperature) * inputs.response_mask
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = entropy_from_logits(logits, temperature=temperature)
    aux = getattr(output, "aux_loss", None)
    if router_aux and not isinstance(aux, torch.Tensor):
        raise ValueError(
            f"worker.actor.router_aux_loss_coef > 0 but {type(output).__name__} carries no router aux_loss: the model "
            "is not a mixture of experts (set worker.actor.router_aux_loss_coef=0)"
        )
    used = _used_routing(replay.take_recorded(), inputs.attention_mask, fused_head is not None, sp) if record else None
    return PolicyScores(log_probs, entropy, aux.float() if router_aux else None, used)


def response_values(model: torch.nn.Module, inputs: ModelInputs, padding_free: bool,
                    sp: Optional[SequenceParallel] = None) -> torch.Tensor:
    """A value model's ``V(s_t)`` (the state before response token ``t``), read where the actor reads token ``t``'s
    log-prob: ``(bsz, R)`` float32, 0 at response padding, differentiable. ``model``'s output embedding is a
    ``hidden -> 1`` value head (``critic.attach_value_head``)."""
    if padding_free:
        packed = _pack(model, inputs)
        out, _ = _packed_forward(model, packed, inputs.multi_modal, sp)
        return packed.unpack(out[:, 0].float())
    out = _padded_outputs(model, inputs)
    return out.logits[:, -inputs.response_mask.shape[1] - 1:-1, 0].float() * inputs.response_mask


def _padded_outputs(model, inputs: ModelInputs, extra=None):
    """The model's output, its ``logits`` ``(bsz, R + 1, out)`` at the last ``R + 1`` padded positions: all but the
    last predict the ``R`` response tokens."""
    kwargs = dict(inputs.multi_modal, **(extra or {}))
    if inputs.mm_token_type_ids is not None:
        kwargs["mm_token_type_ids"] = inputs.mm_token_type_ids  # Qwen-VL computes its mRoPE positions from them
    else:
        kwargs["position_ids"] = family(model.config).positions(inputs.attention_mask)  # as vLLM counts them
    return model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, use_cache=False,
                 logits_to_keep=inputs.response_mask.shape[1] + 1, **kwargs)


def _packed_routing(row: torch.Tensor, sp: Optional[SequenceParallel]) -> torch.Tensor:
    """The packed row's routing ``(total, layers, top_k)``; with ``sp`` this rank's slice of it, the row padded as
    ``SequenceParallel.sharded`` pads it (its dummy tokens keep their own routing)."""
    if sp is None:
        return row
    start, end = sp.local_range(row.shape[0])
    padded = sp.size * (end - start)
    return torch.cat([row, row.new_full((padded - row.shape[0], *row.shape[1:]), NO_EXPERT)])[start:end]


def _used_routing(recorded: torch.Tensor, attention_mask: torch.Tensor, packed: bool,
                  sp: Optional[SequenceParallel]) -> torch.Tensor:
    """The recorded routing ``(tokens, layers, top_k)`` as the forward fed its routers (the packed row, this rank's
    slice of it with ``sp``: gathered over the group; or every padded position) laid out as ``attention_mask``
    ``(bsz, P + R)``: ``(bsz, P + R, layers, top_k)`` int16, ``-1`` at padding."""
    bsz, width = attention_mask.shape
    valid = attention_mask.bool().to(recorded.device)
    if not packed:
        return recorded.reshape(bsz, width, *recorded.shape[1:]).masked_fill(~valid[..., None, None], NO_EXPERT)
    if sp is not None:  # each rank holds its slice of the padded row: all of them, in rank order (int32 for NCCL)
        parts = recorded.to(torch.int32)
        full = parts.new_empty((sp.size * parts.shape[0], *parts.shape[1:]))
        torch.distributed.all_gather_into_tensor(full, parts, group=sp.group)
        recorded = full[: int(valid.sum())].to(torch.int16)
    out = recorded.new_full((bsz, width, *recorded.shape[1:]), NO_EXPERT)
    out[valid] = recorded
    return out


def _pack(model, inputs: ModelInputs):
    multi_modal, entry = inputs.multi_modal, family(model.config)
    positions = None
    if entry.mrope and ("pixel_values" in multi_modal or "pixel_values_videos" in multi_modal):
        # 3-D positions per sequence on the padded layout (padding skipped), then packed with the tokens
        positions, _ = model.model.get_rope_index(
            inputs.input_ids, inputs.mm_token_type_ids, attention_mask=inputs.attention_mask,
            **{key: multi_modal[key] for key in ROPE_INDEX_KEYS if key in multi_modal},
        )
    return pack_sequences(inputs.input_ids, inputs.attention_mask, inputs.response_mask, positions, mrope=entry.mrope,
                          text_positions=entry.positions(inputs.attention_mask))


def _packed_forward(model, packed, multi_modal, sp, scoring=None, extra=None):
    """The model's ``(response tokens, c)`` outputs at ``packed.logit_indices`` (``scoring(labels, keep)``: the fused
    head's context for these labels at those kept positions), and the output; with ``sp`` each rank of the group runs
    its slice of the row (``easyrl.models.ulysses``)."""
    inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, logits_to_keep=packed.logit_indices)
    with sp.sharded(packed.input_ids, packed.position_ids, packed.logit_indices, packed.labels) if sp else \
            nullcontext((inputs, packed.labels, None)) as (inputs, labels, gather):
        # attention_mask=None and use_cache=False: transformers then reads the sequence boundaries off the positions
        with scoring(labels, inputs["logits_to_keep"]) if scoring else nullcontext():
            output = model(**inputs, attention_mask=None, use_cache=False, **multi_modal, **(extra or {}))
        scores = output.logits[0]
        return (gather(scores) if gather else scores), output

