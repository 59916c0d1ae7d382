"""``worker.reward.judge``: a generative LLM judge, served by vLLM on the workers beside the rollout engine, whose
parsed verdict is a named score (``score/judge``) added to the rule reward with a weight (docs/judge.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from easyrl.config.fields import FRACTION, NON_NEGATIVE, POSITIVE, input_path
from easyrl.config.role import Dtype
from easyrl.errors import ConfigError

JUDGE_PARSERS = ("number", "json")
"""The built-in verdict parsers; anything else must be ``path/to/file.py:function``."""


@dataclass
class JudgeConfig:
    """An LLM judge: a Jinja prompt per sample, one greedy vLLM generation per prompt on the workers, a parser that
    turns the verdict text into a score. Off while ``model_path`` is null."""

    model_path: Optional[str] = input_path()
    """Hugging Face folder or hub id of the judge model (an instruct model with a chat template); null: no judge."""
    prompt_template: Optional[str] = input_path()
    """Jinja2 file rendered per sample with ``problem`` (the dataset's ``data.prompt_key`` column), ``response`` (the
    decoded response) and ``ground_truth`` (the ``data.answer_key`` column); its text is the judge's user message
    (the judge's chat template is applied). null: ``easyrl/rewards/judge.jinja`` (shipped in the package)."""
    parser: str = input_path("number")
    """How a verdict becomes a score: ``number`` (the last number in the text), ``json`` (the last JSON object in the
    text, its ``json_key``), or ``path/to/file.py:function`` (``function(verdict: str) -> float | None``; None or an
    exception: unparseable)."""
    json_key: str = "score"
    """The key read by ``parser: json``."""
    unparseable_score: float = 0.0
    """The score of a verdict the parser cannot read (counted in ``judge/unparseable``; the run goes on)."""
    weight: float = 1.0
    """``overall = reward function's overall + weight x judge score``."""
    max_tokens: Annotated[int, POSITIVE] = 64
    """Tokens the judge may generate per verdict."""
    temperature: Annotated[float, NON_NEGATIVE] = 0.0
    """Sampling temperature of the judge (0: greedy)."""
    gpu_memory_utilization: Annotated[float, FRACTION] = 0.3
    """Fraction of device memory the judge's vLLM engine takes (weights + KV cache), resident in every phase beside
    the rollout engine's ``worker.rollout.gpu_memory_utilization`` (``easyrl.workers.judge``); ignored on the CPU."""
    cpu_kvcache_space_gib: Annotated[float, POSITIVE] = 1.0
    """The judge engine's KV cache on the CPU backend (GiB)."""
    dtype: Literal["auto", Dtype] = "auto"
    """The dtype the judge engine runs in: ``bf16``, ``fp16``, ``fp32``, or ``auto`` (vLLM's choice from the
    checkpoint: a float32 one runs in bfloat16, slow on a CPU without bf16 instructions; ``fp32`` there)."""
    max_model_len: Annotated[int, POSITIVE] = 4096
    """Judge prompt + verdict tokens at most (the engine's context); a judge prompt longer than ``max_model_len -
    max_tokens`` is not sent: it is scored ``unparseable_score`` and counted in ``judge/unparseable``."""


def check_judge(judge: JudgeConfig, tensor_parallel_size: int) -> None:
    """``worker.reward.judge``'s values when it is on (``model_path`` set), with the rollout's
    ``tensor_parallel_size``. Raises ``ConfigError``: a parser that is neither a built-in name nor
    ``file.py:function``, no room for a prompt, or a tensor-parallel rollout (not supported with a judge yet)."""
    if judge.model_path is None:
        return
    parser = judge.parser
    if parser not in JUDGE_PARSERS and not (isinstance(parser, str) and ".py:" in parser):
        raise ConfigError(f"worker.reward.judge.parser={parser!r} is not one of {', '.join(JUDGE_PARSERS)} nor "
                          "path/to/file.py:function_name (a function verdict -> float or None).")
    if judge.max_tokens >= judge.max_model_len:
        raise ConfigError(f"worker.reward.judge.max_tokens={judge.max_tokens} leaves no room for the judge's prompt in "
                          f"worker.reward.judge.max_model_len={judge.max_model_len}: every prompt would go unsent and "
                          "score unparseable_score; lower max_tokens (a verdict is a few tokens) or raise max_model_len.")
    if tensor_parallel_size > 1:
        raise ConfigError(f"worker.reward.judge is not supported with worker.rollout.tensor_parallel_size="
                          f"{tensor_parallel_size} yet (the judge engine is one per worker, beside a tensor-parallel "
                          "rollout engine that shares vLLM's process-wide parallel state): set "
                          "worker.rollout.tensor_parallel_size=1 or worker.reward.judge.model_path=null.")
