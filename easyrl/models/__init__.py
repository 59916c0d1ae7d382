"""Model-side runtime helpers: packed (padding-free) inputs (``packing``) and their per-sequence attention
(``packed_attention``), the fused lm_head log-probs (``fused_head``), LoRA (``lora``), the MoE experts' checkpoint
layout (``expert_layout``) and the NPU fused kernels (``npu_kernels``). Test models live in ``easyrl.testing``."""
