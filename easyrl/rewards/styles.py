"""Reward functions written for verl or TRL, called the way those libraries call them (docs/migrating.md).

The style is the file's ``REWARD_STYLE`` or shows in the parameter names:

* ``easyrl``: ``fn(reward_inputs, **kwargs)``, a list (``batch``) or one input (``sequential``) -> score dicts.
* ``verl`` (a parameter ``solution_str``): ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  per sample with keywords, returning the reward or a dict whose ``score`` is the reward (other numbers logged);
  ``data_source``/``extra_info`` are the row's columns (``""``/``{}``), ``ground_truth`` is
  ``reward_model["ground_truth"]`` if present, else the answer column.
* ``trl`` (first parameter ``completions`` or a parameter ``prompts``): ``fn(completions, **kwargs) -> list[float]``
  per batch with ``prompts=``, ``completions=`` (chat messages when the prompt is a conversation) and every other
  column as per-sample lists; ``None`` scores 0.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Callable

STYLES = ("easyrl", "verl", "trl")
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")

__all__ = ["STYLES", "call_trl", "call_verl", "detect_style"]


def detect_style(fn: Callable, declared: Any = None) -> str:
    """``declared`` (``REWARD_STYLE``) if given, else the style of ``fn``'s parameter names; ValueError for another."""
    if declared is not None:
        if declared not in STYLES:
            raise ValueError(f"REWARD_STYLE={declared!r} must be one of {STYLES}")
        return declared
    names = [p.name for p in inspect.signature(fn).parameters.values()]
    if "solution_str" in names:
        return "verl"
    if names[:1] == ["completions"] or "prompts" in names:
        return "trl"
    return "easyrl"


def _accepted(fn: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` that ``fn`` takes (all of them when it has ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return arguments
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {key: value for key, value in arguments.items() if key in names}


def call_verl(fn: Callable, reward_input: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, float]:
    """One sample scored as verl does; ``overall`` is ``score``. ValueError for a dict without ``score``."""
    columns = reward_input.get("columns") or {}
    reward_model = columns.get("reward_model")
    has_truth = isinstance(reward_model, dict) and "ground_truth" in reward_model
    arguments = {"data_source": columns.get("data_source", ""), "solution_str": reward_input["response"],
                 "ground_truth": reward_model["ground_truth"] if has_truth else reward_input["ground_truth"],
                 "extra_info": columns.get("extra_info") or {}}
    result = fn(**_accepted(fn, arguments), **kwargs)
    if not isinstance(result, dict):
        return {"overall": result}
    if "score" not in result:
        raise ValueError(f"a verl-style reward function returned a dict without 'score' (got {sorted(result)})")
    scores = {"overall": result["score"]}
    for name, value in result.items():  # verl logs the other entries; easyrl logs the numeric ones
        if name != "score" and isinstance(value, numbers.Real):
            scores[name] = float(value)
    return scores


def _is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt) and bool(prompt)


def call_trl(fn: Callable, reward_inputs: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[dict[str, float]]:
    """A batch scored as TRL does, one ``{"overall"}`` per input; ValueError unless one value per input comes back."""
    rows = [reward_input.get("columns") or {} for reward_input in reward_inputs]
    prompts = [row.get("prompt") for row in rows]
    completions = [[{"role": "assistant", "content": x["response"]}] if _is_conversation(prompt) else x["response"]
                   for x, prompt in zip(reward_inputs, prompts)]
    columns = {key: [row.get(key) for row in rows] for key in (rows[0] if rows else {}) if key != "prompt"}
    values = fn(**_accepted(fn, {"prompts": prompts, "completions": completions, **columns, **kwargs}))
    if not isinstance(values, (list, tuple)) or len(values) != len(reward_inputs):
        shown = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
        raise ValueError(f"a TRL-style reward function returned {shown} for {len(reward_inputs)} completions; it "
                         "must return a list of one float (or None) per completion")
    return [{"overall": 0.0 if value is None else value} for value in values]
