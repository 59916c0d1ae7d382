"""The pure parts of the LLM judge (``worker.reward.judge``, docs/judge.md): the Jinja prompt and the verdict
parsers (``number``, ``json``, ``path/to/file.py:function``). A verdict no parser can read is scored
``unparseable_score`` and counted, never a crash."""

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

DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "judge.jinja"
"""The template used when ``worker.reward.judge.prompt_template`` is null."""

TEMPLATE_VARIABLES = ("problem", "response", "ground_truth")

_DENOMINATOR = re.compile(r"(?:/|\bout of\b)\s*[-+]?(?:\d+\.\d*|\.\d+|\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def parse_number(verdict: str) -> Optional[float]:
    """The last number in ``verdict``, a denominator not counted (``"Score: 7/10"`` -> 7.0), or None."""
    found = _NUMBER.findall(_DENOMINATOR.sub("", verdict))
    return float(found[-1]) if found else None


def parse_json(verdict: str, key: str) -> Optional[float]:
    """``obj[key]`` of the last JSON object in ``verdict`` holding a number (not a bool) there, or None."""
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
    """``verdict -> score | None`` of ``worker.reward.judge.parser``; ConfigError for a file that does not exist or
    import, or lacks the function."""
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
    """``(scores, unparseable)``: one float per verdict, and how many got ``unparseable_score`` (a None verdict, or a
    parser that returned None or a non-finite value, or raised)."""
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
    """``JudgePrompt(path).render(problem, response, ground_truth) -> str``; ConfigError for a missing file, invalid
    Jinja2 or another variable (naming the key, file and line)."""

    def __init__(self, path: Optional[str]):
        self.path = os.fspath(path) if path is not None else str(DEFAULT_TEMPLATE)
        key = "worker.reward.judge.prompt_template"
        if not os.path.isfile(self.path):
            raise ConfigError(f"{key}={self.path!r} does not exist: give a Jinja file using {{{{ problem }}}}, "
                              f"{{{{ response }}}} and {{{{ ground_truth }}}} (e.g. easyrl/rewards/judge.jinja).")
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
    """Prompts from reward inputs and scores from verdicts (``worker.reward.judge``); raises as its parts."""

    def __init__(self, config: Any):
        self.config = config
        self.prompt = JudgePrompt(config.prompt_template)
        self.parser = load_parser(config.parser, config.json_key)

    def prompts(self, reward_inputs: list[dict[str, Any]]) -> list[str]:
        """One user message per reward input (the problem is ``columns["prompt"]``)."""
        return [self.prompt.render(item.get("columns", {}).get("prompt", ""), item["response"], item["ground_truth"])
                for item in reward_inputs]

    def scores(self, verdicts: list[Optional[str]]) -> tuple[list[float], int]:
        """:func:`score_verdicts` with the configured parser and ``unparseable_score``."""
        return score_verdicts(verdicts, self.parser, self.config.unparseable_score)


def load_judge(config: Any) -> Optional[Judge]:
    """The ``Judge`` of ``worker.reward.judge``, or None when ``model_path`` is null."""
    return None if config.model_path is None else Judge(config)
