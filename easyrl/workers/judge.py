"""The LLM judge's engine: a second in-process vLLM engine on each worker, beside the rollout engine, that turns
judge prompts (rendered by the trainer) into verdict texts with the judge's own chat template (docs/judge.md). Built
on first use, then resident: vLLM's sleep mode would act on every engine of the process (one ``CuMemAllocator``).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Optional

from easyrl import envvars
from easyrl.config.judge import JudgeConfig
from easyrl.config.role import DTYPES
from easyrl.quiet import verbose


def judge_engine_arguments(config: JudgeConfig, device: str, seed: int, enforce_eager: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of the judge engine (a pure function): ``judge.dtype``, ``max_model_len``, no
    images or videos, prefix caching; on GPUs/NPUs ``gpu_memory_utilization`` and no sleep mode. ``seed`` and
    ``enforce_eager`` are the rollout's.
    """
    dtype = DTYPES[config.dtype].torch_name if config.dtype in DTYPES else config.dtype  # "auto": vLLM's choice
    kwargs: dict[str, Any] = dict(
        model=config.model_path, dtype=dtype, seed=seed,
        max_model_len=config.max_model_len, max_num_batched_tokens=max(8192, config.max_model_len),
        enforce_eager=enforce_eager, limit_mm_per_prompt={"image": 0, "video": 0}, disable_log_stats=True,
        use_tqdm_on_load=verbose(), enable_prefix_caching=True)
    if device != "cpu":
        kwargs.update(gpu_memory_utilization=config.gpu_memory_utilization, disable_custom_all_reduce=True)
    return kwargs


class VLLMJudge:
    """One judge engine per worker (arguments: :func:`judge_engine_arguments`)."""

    def __init__(self, config: JudgeConfig, device: str, seed: int, enforce_eager: bool):
        from vllm import LLM

        self.config = config
        kwargs = judge_engine_arguments(config, device, seed, enforce_eager)
        # on the CPU, read when the engine is built; the rollout engine's value is put back afterwards
        space = str(max(1, math.ceil(config.cpu_kvcache_space_gib)))
        with envvars.replaced(os.environ, envvars.CPU_KVCACHE, space) if device == "cpu" else contextlib.nullcontext():
            self.llm = LLM(**kwargs)

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
        # each message chat-templated alone, generation prompt appended; the template's own special tokens only
        ids = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                                              add_generation_prompt=True), add_special_tokens=False)
               for message in messages]
        fits = [i for i, prompt in enumerate(ids) if len(prompt) + cfg.max_tokens <= cfg.max_model_len]
        params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens)
        outputs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in fits], sampling_params=params,
                                    use_tqdm=False) if fits else []
        verdicts: list[Optional[str]] = [None] * len(messages)
        for i, out in zip(fits, outputs):
            verdicts[i] = out.outputs[0].text
        return verdicts
