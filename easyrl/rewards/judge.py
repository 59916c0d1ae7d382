"""The pure parts of the LLM judge (``worker.reward.judge``): the Jinja judge prompt, the verdict parsers and the count
of unparseable verdicts. The judge's engine runs on the workers (``easyrl.workers.judge``); the trainer renders the
prompts here, sends them to the workers and parses what comes back (``easyrl.trainer.model_rewards``).

A verdict becomes a score by the configured parser:

* ``number``: the last number in the text, a denominator not counted (``"7"`` -> 7.0, ``"I give it 3.5."`` -> 3.5,
  ``"Score: 7/10"`` and ``"7 out of 10"`` -> 7.0);
* ``json``: the last ``{...}`` object in the text that parses as JSON and holds ``json_key`` with a number;
* ``path/to/file.py:function``: ``function(verdict: str) -> float | None``.

A verdict no parser can read (no number, no such key, the function returned None, a non-finite number, or raised)
is scored ``unparseable_score`` and counted: never a crash (the judge is a model; its output is not trusted).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Optional

import jinja2

from easyrl.errors import ConfigError, check_signature
from easyrl.rewards.function import load_function

DEFAULT_TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "judge" / "judge.jinja"
"""The template used when ``worker.reward.judge.prompt_template`` is null (the easyrl repository's example)."""

TEMPLATE_VARIABLES = ("problem", "response", "ground_truth")

_DENOMINATOR = re.compile(r"(?:/|\bout of\b)\s*[-+]?(?:\d+\.\d*|\.\d+|\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def parse_number(verdict: str) -> Optional[float]:
    """The last number in ``verdict`` (integers, decimals, a sign, an exponent), or None without one.

    A denominator (``/ 10``, ``out of 10``) is not a score: ``"Score: 7/10"`` -> 7.0. E.g. ``"The answer is correct.
    Score: 8"`` -> 8.0; ``"no idea"`` -> None."""
    found = _NUMBER.findall(_DENOMINATOR.sub("", verdict))
    return float(found[-1]) if found else None


def parse_json(verdict: str, key: str) -> Optional[float]:
    """``obj[key]`` of the last JSON object in ``verdict`` that holds ``key`` with a number (a bool is not one), or
    None. E.g. ``'{"score": 4}'`` -> 4.0 with ``key="score"``; ``'score: 4'`` -> None."""
    decoder = json.JSONDecoder()
    found = None
    for start in [m.start() for m in re.finditer(r"\{", verdict)]:
        try:
            obj, _ = decoder.raw_decode(verdict, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get(key), (int, float)) and not isinstance(obj.get(key), bool):
            found = float(obj[key])
    return found


def load_parser(parser: str, json_key: str = "score") -> Callable[[str], Optional[float]]:
    """The verdict parser named by ``worker.reward.judge.parser``: ``verdict -> score | None``.

    Raises:
        ConfigError: a ``file.py:function`` whose file does not exist, does not import, or has no such function.
    """
    if parser == "number":
        return parse_number
    if parser == "json":
        return lambda verdict: parse_json(verdict, json_key)
    path = parser.rsplit(":", 1)[0]
    if not os.path.isfile(path):
        raise ConfigError(f"worker.reward.judge.parser={parser!r}: the file {path!r} does not exist; give "
                          "number, json or an existing path/to/file.py:function_name.")
    try:
        fn, _, _ = load_function(parser)
    except Exception as err:
        raise ConfigError(f"worker.reward.judge.parser={parser!r}: {type(err).__name__}: {err}") from None
    check_signature(fn, "worker.reward.judge.parser", parser, "fn(verdict)")
    return fn


def score_verdicts(verdicts: list[Optional[str]], parser: Callable[[str], Any],
                   unparseable_score: float) -> tuple[list[float], int]:
    """Parse every verdict; returns ``(scores, unparseable)``: one float per verdict, and how many were scored
    ``unparseable_score`` (a None verdict: the prompt did not fit the judge's context; a parser that returned None,
    something not a finite number, or raised)."""
    scores, unparseable = [], 0
    for verdict in verdicts:
        try:
            value = None if verdict is None else parser(verdict)
            value = float(value) if value is not None and not isinstance(value, bool) else None
        except Exception:
            value = None
        if value is None or not math.isfinite(value):
            scores.append(float(unparseable_score))
            unparseable += 1
        else:
            scores.append(value)
    return scores, unparseable


class JudgePrompt:
    """The judge's Jinja template; ``JudgePrompt(path).render(problem, response, ground_truth) -> str``.

    Raises (at construction):
        ConfigError: the file does not exist, is not valid Jinja2, or uses a variable other than ``problem``,
            ``response`` and ``ground_truth`` (names ``worker.reward.judge.prompt_template``, the file and the line).
    """

    def __init__(self, path: Optional[str]):
        self.path = os.fspath(path) if path is not None else str(DEFAULT_TEMPLATE)
        key = "worker.reward.judge.prompt_template"
        if not os.path.isfile(self.path):
            raise ConfigError(f"{key}={self.path!r} does not exist: give a Jinja file using {{{{ problem }}}}, "
                              f"{{{{ response }}}} and {{{{ ground_truth }}}} (e.g. examples/judge/judge.jinja).")
        with open(self.path, encoding="utf-8") as f:
            self.source = f.read()
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
        try:
            self.template = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as err:
            raise ConfigError(f"{key}={self.path!r} line {err.lineno}: {err.message}") from None
        try:
            shown = self.render("a problem", "EASYRL_RESPONSE", "an answer")
        except jinja2.UndefinedError as err:
            raise ConfigError(f"{key}={self.path!r} uses an undefined variable ({err.message}); the judge template "
                              f"gets {', '.join(TEMPLATE_VARIABLES)}.") from None
        if "EASYRL_RESPONSE" not in shown:
            raise ConfigError(f"{key}={self.path!r} does not show the response: the judge would score every sample "
                              "without reading it; put {{ response }} in the template.")

    def render(self, problem: Any, response: str, ground_truth: Any) -> str:
        """The judge's user message for one sample."""
        return self.template.render(problem=problem, response=response, ground_truth=ground_truth)


class Judge:
    """What the trainer needs of the judge config (``worker.reward.judge``): prompts from reward inputs, scores from
    verdicts.

    Raises:
        ConfigError: see :class:`JudgePrompt` and :func:`load_parser`.
    """

    def __init__(self, config: Any):
        self.config = config
        self.prompt = JudgePrompt(config.prompt_template)
        self.parser = load_parser(config.parser, config.json_key)

    def prompts(self, reward_inputs: list[dict[str, Any]]) -> list[str]:
        """One user message per sample, from ``easyrl.trainer.scoring.Scorer.reward_inputs`` (the problem is the
        dataset row's prompt column, ``columns["prompt"]``)."""
        return [self.prompt.render(item.get("columns", {}).get("prompt", ""), item["response"], item["ground_truth"])
                for item in reward_inputs]

    def scores(self, verdicts: list[Optional[str]]) -> tuple[list[float], int]:
        """:func:`score_verdicts` with the configured parser and ``unparseable_score``."""
        return score_verdicts(verdicts, self.parser, self.config.unparseable_score)


def load_judge(config: Any) -> Optional[Judge]:
    """The ``Judge`` of ``worker.reward.judge``, or None when it is off (``model_path`` null).

    Raises:
        ConfigError: see :class:`Judge`.
    """
    return None if config.model_path is None else Judge(config)
