"""The LLM judge's engine: a second in-process vLLM engine on each worker, beside the rollout engine
(``easyrl.workers.rollout``), that turns judge prompts into verdict texts (``worker.reward.judge``, docs/judge.md).

It is built on first use (the first step's judge phase: on GPUs/NPUs the rollout engine is then asleep and the actor
idle, so vLLM's start-up profiling finds the memory ``judge.gpu_memory_utilization`` asks for) and stays resident:
it has no sleep mode, because vLLM's sleep mode acts on every allocation of the process's one ``CuMemAllocator``,
whichever engine made it (docs/judge.md). The prompt text comes rendered from the trainer (``easyrl.rewards.judge``);
the judge's own chat template is applied here, with its tokenizer.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from easyrl.config.judge import JudgeConfig
from easyrl.quiet import verbose
from easyrl.workers.rollout import _DTYPES


def judge_engine_arguments(config: JudgeConfig, device: str, seed: int, enforce_eager: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of the judge engine (a pure function of ``worker.reward.judge``, the device, the
    sampling ``seed`` of ``worker.rollout.seed`` and ``worker.rollout.enforce_eager``, shared with the rollout engine):
    ``judge.dtype`` (``auto``: vLLM's choice), ``max_model_len``, no images or videos (a vision-language judge reads
    text here), prefix caching (every judge prompt starts with the same template text); on GPUs/NPUs
    ``gpu_memory_utilization`` and no sleep mode (see the module docstring; the CPU backend sizes its KV cache from
    ``VLLM_CPU_KVCACHE_SPACE``, set by :class:`VLLMJudge` while it builds the engine).
    """
    kwargs: dict[str, Any] = dict(
        model=config.model_path,
        dtype=_DTYPES.get(config.dtype, config.dtype),
        seed=seed,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=max(8192, config.max_model_len),
        enforce_eager=enforce_eager,
        limit_mm_per_prompt={"image": 0, "video": 0},
        disable_log_stats=True,
        use_tqdm_on_load=verbose(),
        enable_prefix_caching=True,
    )
    if device != "cpu":
        kwargs.update(gpu_memory_utilization=config.gpu_memory_utilization, disable_custom_all_reduce=True)
    return kwargs


def chat_prompt_ids(tokenizer: Any, message: str) -> list[int]:
    """The judge model's chat-templated token ids of one user ``message`` (generation prompt appended; the template's
    own special tokens only, none added by the tokenizer)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


class VLLMJudge:
    """One judge engine per worker (arguments: :func:`judge_engine_arguments`)."""

    def __init__(self, config: JudgeConfig, device: str, seed: int, enforce_eager: bool):
        from vllm import LLM

        self.config = config
        self.device = device
        kwargs = judge_engine_arguments(config, device, seed, enforce_eager)
        previous = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        if device == "cpu":  # read when the engine is built; the rollout engine's value is put back afterwards
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(config.cpu_kvcache_space_gib)))
        try:
            self.llm = LLM(**kwargs)
        finally:
            if device == "cpu":
                os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
                if previous is not None:
                    os.environ["VLLM_CPU_KVCACHE_SPACE"] = previous

    def judge(self, messages: list[str]) -> list[Optional[str]]:
        """One verdict per judge prompt (``worker.reward.judge.max_tokens`` tokens at most, at its ``temperature``;
        0 = greedy).

        ``messages``: the rendered judge prompts (user messages; the chat template is applied here). Returns the
        verdict texts in order; None for a prompt longer than ``max_model_len - max_tokens`` tokens (not sent; the
        trainer scores it ``unparseable_score``).
        """
        from vllm import SamplingParams

        cfg = self.config
        tokenizer = self.llm.get_tokenizer()
        ids = [chat_prompt_ids(tokenizer, message) for message in messages]
        fits = [i for i, prompt in enumerate(ids) if len(prompt) + cfg.max_tokens <= cfg.max_model_len]
        params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens)
        outputs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in fits], sampling_params=params,
                                    use_tqdm=False) if fits else []
        verdicts: list[Optional[str]] = [None] * len(messages)
        for i, out in zip(fits, outputs):
            verdicts[i] = out.outputs[0].text
        return verdicts
