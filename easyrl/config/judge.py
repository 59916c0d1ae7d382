"""``worker.reward.judge``: a generative LLM judge, served by vLLM on the workers beside the rollout engine, whose
parsed verdict is a named score (``score/judge``) added to the rule reward with a weight (docs/judge.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from easyrl.errors import ConfigError

JUDGE_PARSERS = ("number", "json")
"""The built-in verdict parsers; anything else must be ``path/to/file.py:function``."""
JUDGE_DTYPES = ("auto", "bf16", "fp16", "fp32")


@dataclass
class JudgeConfig:
    """An LLM judge: a Jinja prompt per sample, one greedy vLLM generation per prompt on the workers, a parser that
    turns the verdict text into a score. Off while ``model_path`` is null."""

    model_path: Optional[str] = None
    """Hugging Face folder or hub id of the judge model (an instruct model with a chat template); null: no judge."""
    prompt_template: Optional[str] = None
    """Jinja2 file rendered per sample with ``problem`` (the dataset's ``data.prompt_key`` column), ``response`` (the
    decoded response) and ``ground_truth`` (the ``data.answer_key`` column); its text is the judge's user message
    (the judge's chat template is applied). null: ``examples/judge/judge.jinja`` of the easyrl repository."""
    parser: str = "number"
    """How a verdict becomes a score: ``number`` (the last number in the text), ``json`` (the last JSON object in the
    text, its ``json_key``), or ``path/to/file.py:function`` (``function(verdict: str) -> float | None``; None or an
    exception: unparseable)."""
    json_key: str = "score"
    """The key read by ``parser: json``."""
    unparseable_score: float = 0.0
    """The score of a verdict the parser cannot read (counted in ``judge/unparseable``; the run goes on)."""
    weight: float = 1.0
    """``overall = reward function's overall + weight x judge score``."""
    max_tokens: int = 64
    """Tokens the judge may generate per verdict."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy)."""
    gpu_memory_utilization: float = 0.3
    """Fraction of device memory the judge's vLLM engine takes (weights + KV cache), resident in every phase beside
    the rollout engine's ``worker.rollout.gpu_memory_utilization`` (``easyrl.workers.judge``); ignored on the CPU."""
    cpu_kvcache_space_gib: float = 1.0
    """The judge engine's KV cache on the CPU backend (GiB)."""
    dtype: str = "auto"
    """The dtype the judge engine runs in: ``bf16``, ``fp16``, ``fp32``, or ``auto`` (vLLM's choice from the
    checkpoint: a float32 one runs in bfloat16, slow on a CPU without bf16 instructions; ``fp32`` there)."""
    max_model_len: int = 4096
    """Judge prompt + verdict tokens at most (the engine's context); a judge prompt longer than ``max_model_len -
    max_tokens`` is not sent: it is scored ``unparseable_score`` and counted in ``judge/unparseable``."""


JUDGE_RANGE_RULES: dict[str, tuple[str, ...]] = {
    "positive": ("worker.reward.judge.max_tokens", "worker.reward.judge.cpu_kvcache_space_gib",
                 "worker.reward.judge.max_model_len"),
    "non_negative": ("worker.reward.judge.temperature",),
    "fraction": ("worker.reward.judge.gpu_memory_utilization",),
}
"""``easyrl.config.checks.RANGE_RULES``' rules for the judge's keys (checked by :func:`check_judge`)."""


def check_judge(judge: JudgeConfig, tensor_parallel_size: int, check_range: Any) -> None:
    """The judge's values, when it is on (``model_path`` set).

    Args:
        judge: ``worker.reward.judge``.
        tensor_parallel_size: ``worker.rollout.tensor_parallel_size``.
        check_range: ``easyrl.config.checks.check_range``.

    Raises:
        ConfigError: a key out of range, an unknown ``dtype``, a parser that is neither a built-in name nor
            ``file.py:function``, or a tensor-parallel rollout (not supported with a judge yet). (An empty
            ``json_key`` is refused by ``easyrl.config.malformed`` before.)
    """
    if judge.model_path is None:
        return
    for rule, keys in JUDGE_RANGE_RULES.items():
        for key in keys:
            check_range(key, getattr(judge, key.rsplit(".", 1)[1]), rule)
    if judge.dtype not in JUDGE_DTYPES:
        raise ConfigError(f"worker.reward.judge.dtype={judge.dtype!r} is not one of {', '.join(JUDGE_DTYPES)}.")
    parser = judge.parser
    if parser not in JUDGE_PARSERS and not (isinstance(parser, str) and ".py:" in parser):
        raise ConfigError(f"worker.reward.judge.parser={parser!r} is not one of {', '.join(JUDGE_PARSERS)} nor "
                          "path/to/file.py:function_name (a function verdict -> float or None).")
    if tensor_parallel_size > 1:
        raise ConfigError(f"worker.reward.judge is not supported with worker.rollout.tensor_parallel_size="
                          f"{tensor_parallel_size} yet (the judge engine is one per worker, beside a tensor-parallel "
                          "rollout engine that shares vLLM's process-wide parallel state): set "
                          "worker.rollout.tensor_parallel_size=1 or worker.reward.judge.model_path=null.")
