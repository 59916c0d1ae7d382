"""The simulated device's attention (easyrl/simulate/attention.py): the actor's padding-free forwards run
flash-attention's varlen kernel and padded SDPA calls the memory-efficient kernel with the mask as a bias, so an
attention call holds its output and a log-sum-exp, as on an H100, not the ``(heads, S, S)`` weights of the math path
that fake tensors take otherwise; and backward runs through both kernels on the update phase's fake CPU world."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from easyrl.models.packed_attention import PACKED_SDPA
from easyrl.simulate.attention import SIMULATED_VARLEN
from easyrl.simulate.fake_device import accelerator_standins, fake_tensors
from easyrl.sizing.devices import DEVICES
from easyrl.workers import trainable

S, HEADS, KV_HEADS, HEAD_DIM = 4096, 4, 2, 64  # the math path's float32 weights: HEADS x S^2 x 4 B = 256 MiB a row
MIB = 2**20
OUTPUT = S * HEADS * HEAD_DIM * 2  # bf16
LSE = HEADS * S * 4  # float32 log-sum-exp per query row


def _module():
    return SimpleNamespace(is_causal=True, num_key_value_groups=HEADS // KV_HEADS, training=False)


def _qkv(rows: int, device: str, grad: bool = False):
    return [torch.empty(rows, heads, S, HEAD_DIM, dtype=torch.bfloat16, device=device, requires_grad=grad)
            for heads in (HEADS, KV_HEADS, KV_HEADS)]


def _packed_attention(device: str, grad: bool = False):
    """The actor's padding-free attention, as the worker picks it (``FSDPPolicy`` asks ``attention_implementation``
    with ``is_flash_attn_2_available()``), over one packed row of two 2048-token sequences."""
    name = trainable.attention_implementation(device, True, "bf16", trainable.is_flash_attn_2_available(), False)
    q, k, v = _qkv(1, device, grad)
    positions = torch.cat([torch.arange(S // 2), torch.arange(S // 2)]).unsqueeze(0).to(device)
    return name, (q, k, v), lambda: AttentionInterface()[name](_module(), q, k, v, None, position_ids=positions,
                                                              is_causal=True)[0]


def _backward_ops(out: torch.Tensor) -> set[str]:
    """The autograd nodes on the first-input chain from ``out`` back to the attention kernel."""
    names, node = set(), out.grad_fn
    while node is not None and len(names) < 10:
        names.add(type(node).__name__)
        node = node.next_functions[0][0] if node.next_functions else None
    return names


def _peak(mode, run):
    mode.reset_peak()
    base = mode.allocated
    out = run()
    return out, mode.peak - base


@pytest.mark.parametrize("device", ["cuda", "cpu"], ids=["forward-phases", "update-phase"])
def test_the_actor_picks_the_varlen_kernel_of_the_simulated_device(device):
    """Inside the simulated device the actor's choice is the H100's with flash_attn installed, also on the update
    phase's CPU world; fp32 keeps the per-sequence SDPA, padded batches SDPA (as on the device)."""
    with accelerator_standins(DEVICES["h100"]):
        assert trainable.attention_implementation(device, True, "bf16", False, False) == SIMULATED_VARLEN
        assert trainable.attention_implementation(device, True, "fp32", False, False) == PACKED_SDPA
        assert trainable.attention_implementation(device, False, "bf16", False, False) == "sdpa"
    with accelerator_standins(DEVICES["910b"]):
        assert trainable.attention_implementation(device, True, "bf16", False, False) == SIMULATED_VARLEN
        assert trainable.attention_implementation(device, True, "bf16", False, True) == PACKED_SDPA  # no window_size


def test_packed_attention_holds_output_and_log_sum_exp_not_weights():
    with accelerator_standins(DEVICES["h100"]), fake_tensors("cuda") as mode:
        name, _, run = _packed_attention("cuda")
        out, peak = _peak(mode, run)
    assert name == SIMULATED_VARLEN and out.shape == (1, S, HEADS, HEAD_DIM)
    assert peak == pytest.approx(OUTPUT + LSE, abs=4096)  # + the int32 sequence offsets


def test_without_the_device_kernels_the_same_call_holds_s_squared_weights():
    """The size above discriminates: the math path on fake cuda tensors holds each sequence's weights."""
    with accelerator_standins(DEVICES["h100"], fused_attention=False), fake_tensors("cuda") as mode:
        _, _, run = _packed_attention("cuda")
        _, peak = _peak(mode, run)
    assert peak > HEADS * (S // 2) ** 2 * 4


def _padded(mode, device: str, grad: bool = False):
    q, k, v = _qkv(2, device, grad)
    mask = torch.ones(2, 1, S, S, dtype=torch.bool, device=device)  # a padding mask, as transformers' sdpa builds it
    mask[0, :, :, -100:] = False
    out, peak = _peak(mode, lambda: sdpa_attention_forward(_module(), q, k, v, mask)[0])
    return (q, k, v), out, peak


def test_padded_sdpa_takes_the_memory_efficient_kernel_with_the_mask_as_a_bias():
    """transformers repeats the grouped heads before a masked call (the device holds those copies too), SDPA turns
    the boolean mask into a bf16 bias (through a transient ``logical_not`` of the mask, as SDPA's
    ``convert_boolean_attn_mask``); then output + log-sum-exp, below that transient."""
    with accelerator_standins(DEVICES["h100"]), fake_tensors("cuda") as mode:
        _, out, peak = _padded(mode, "cuda")
        repeated_kv, bias, not_mask = 2 * 2 * OUTPUT, 2 * S * S * 2, 2 * S * S
        assert out.shape == (2, S, HEADS, HEAD_DIM)
        assert peak == pytest.approx(repeated_kv + bias + max(not_mask, 2 * (OUTPUT + LSE)), abs=4096)
    with accelerator_standins(DEVICES["h100"], fused_attention=False), fake_tensors("cuda") as mode:
        assert _padded(mode, "cuda")[2] > 2 * HEADS * S * S * 4  # the math path: float32 weights


def test_backward_runs_through_both_kernels_on_the_update_phase_world():
    """The update phase runs on fake CPU tensors (docs/simulate.md, Backward): autograd goes through the kernels'
    backward ops (meta kernels), gradients of the inputs' shapes, and backward holds no ``S x S`` weights."""
    with accelerator_standins(DEVICES["h100"]), fake_tensors("cpu") as mode:
        _, (q, k, v), run = _packed_attention("cpu", grad=True)
        out = run()
        assert "FlashAttentionBackward0" in _backward_ops(out)  # one varlen kernel over the packed row
        _, peak = _peak(mode, lambda: out.float().sum().backward())
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        assert peak < 8 * OUTPUT
        (q, k, v), out, _ = _padded(mode, "cpu", grad=True)
        assert "ScaledDotProductEfficientAttentionBackward0" in _backward_ops(out)
        out.float().sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_the_math_path_is_kept_where_cuda_takes_it_too():
    """fp32 with grouped-query heads and no mask (transformers passes ``enable_gqa=True``): the flash kernel has no
    fp32, the memory-efficient kernel no GQA, so CUDA runs the math path; with the heads repeated, the
    memory-efficient kernel (output + log-sum-exp)."""
    with accelerator_standins(DEVICES["h100"]), fake_tensors("cuda") as mode:
        q, k, v = (t.float() for t in _qkv(1, "cuda"))
        _, grouped = _peak(mode, lambda: sdpa_attention_forward(_module(), q, k, v, None)[0])
        repeated = SimpleNamespace(is_causal=True, num_key_value_groups=1, training=False)
        _, plain = _peak(mode, lambda: sdpa_attention_forward(repeated, q, q, q, None)[0])
    assert grouped > HEADS * S * S * 4
    assert plain == pytest.approx(2 * OUTPUT, abs=4096)  # float32 output; no log-sum-exp without autograd, as SDPA
