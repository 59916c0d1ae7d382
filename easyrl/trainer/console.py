"""The console backend: a tqdm bar over the training steps and one short line per step (docs/metrics.md)."""

from __future__ import annotations

import sys
from typing import Optional

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

# (label, metric keys tried in order, format): the first key present in a step's metrics is shown
SUMMARY_FIELDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("critic/score/mean", "reward/overall"), "{:.3f}"),
    ("acc", ("reward/accuracy",), "{:.3f}"),
    ("len", ("response_length/mean",), "{:.1f}"),
    ("tools", ("multi_turn/tool_calls_per_traj/mean",), "{:.2f}/sample"),
    ("errors", ("multi_turn/tool_errors",), "{:.0f}"),
    ("kl", ("actor/kl_loss", "actor/reward_kl_penalty"), "{:.4f}"),
    ("ent", ("actor/entropy",), "{:.3g}"),
    ("", ("timing_s/step",), "{:.1f}s"),
    ("", ("perf/throughput",), "{:.0f} tok/s/dev"),
    ("mfu", ("perf/mfu/actor",), "{:.1%}"),
    ("val", ("val/reward/overall",), "{:.3f}"),
)
SHARED_FIELDS = {"acc": "reward", "errors": "tools"}  # a field shown in the part of the field named here


def summary_line(metrics: dict[str, float], step: int, total: Optional[int] = None) -> str:
    """``step 3/10 | reward 0.412 acc 0.250 | ...``: the :data:`SUMMARY_FIELDS` present in ``metrics``, in order
    (:data:`SHARED_FIELDS` share their part)."""
    head = f"step {step}/{total}" if total else f"step {step}"
    parts = [head]
    for label, keys, fmt in SUMMARY_FIELDS:
        key = next((k for k in keys if k in metrics and isinstance(metrics[k], (int, float))), None)
        if key is None:
            continue
        text = (f"{label} " if label else "") + fmt.format(metrics[key])
        if parts[-1].startswith(SHARED_FIELDS.get(label, "|")):
            parts[-1] += " " + text
        else:
            parts.append(text)
    return " | ".join(parts)


class ConsoleLogger:
    """A tqdm bar over ``total_steps`` (``initial`` done already) with the latest reward, and :func:`summary_line`
    per logged step above it (stderr)."""

    def __init__(self, total_steps: Optional[int] = None, initial: int = 0):
        self.total = total_steps
        self.bar = None
        self._redirect = None
        if total_steps:
            self.bar = tqdm(total=total_steps, initial=initial, desc="training", unit="step", file=sys.stderr,
                            dynamic_ncols=True, mininterval=1.0)
            # log records of this process (warnings) are written above the bar instead of through it
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    def log(self, metrics: dict[str, float], step: int, generations: Optional[list[dict]] = None) -> None:
        """Write the step's summary line and move the bar to ``step``."""
        line = summary_line(metrics, step, self.total)
        if self.bar is None:
            print(line, file=sys.stderr, flush=True)
            return
        self.bar.write(line, file=sys.stderr)
        reward = metrics.get("critic/score/mean")
        if isinstance(reward, (int, float)):
            self.bar.set_postfix(reward=f"{reward:.3f}", refresh=False)
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        if self.bar is not None:
            self.bar.close()
