"""One line for each way a command-line word, a YAML file or an interpolation can be malformed, naming the culprit
and what to write instead (docs/errors.md, "Malformed words, files and values"); ``easyrl.config.loading`` calls these
at its steps. A key repeated on the command line is not an error (the later word wins); one repeated inside a YAML
mapping is (PyYAML's "found duplicate key", with its line).
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Optional

from easyrl.errors import ConfigError

_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")
_MISSING_ENV = re.compile(r"Environment variable '([^']+)' not found")
_RESOLVER = re.compile(r"Unsupported interpolation type (\S+)")


def check_words(argv: list[str]) -> None:
    """Refuse command-line words that cannot mean anything: ``=value`` without a key, an empty ``config=``, ``config=``
    given twice (the first file would be ignored) or naming a folder.

    Raises:
        ConfigError: naming the word and what to write instead.
    """
    configs = [word.split("=", 1)[1] for word in argv if word.startswith("config=")]
    for word in argv:
        if word.startswith("="):
            raise ConfigError(f"Command-line word '{word}' has no key before '=': write key=value, e.g. "
                              f"data.max_prompt_length{word}.")
    if len(configs) > 1:
        raise ConfigError(f"config= is given {len(configs)} times ({', '.join(repr(c) for c in configs)}); easyrl "
                          "reads one YAML file: merge them into one, or give the later file's settings as key=value "
                          "words after config=.")
    if configs and not configs[0].strip():
        raise ConfigError("config= is empty: give the path of a YAML file, e.g. config=examples/configs/cpu_demo.yaml,"
                          " or leave the word out to start from the defaults.")
    if configs and os.path.isdir(configs[0]):
        found = sorted(name for name in os.listdir(configs[0]) if name.endswith((".yaml", ".yml")))
        example = os.path.join(configs[0], found[0]) if found else os.path.join(configs[0], "<file>.yaml")
        raise ConfigError(f"Config file '{configs[0]}' (from config=) is a folder: give one YAML file, e.g. "
                          f"config={example}.")


def read_error(err: Exception, path: str) -> str:
    """The one line for a YAML file that PyYAML parsed but OmegaConf or the decoder could not read."""
    if isinstance(err, UnicodeDecodeError):
        with open(path, "rb") as f:
            head = f.read(err.start)
        line = head.count(b"\n") + 1
        column = err.start - (head.rfind(b"\n") + 1) + 1
        return (f"Config file '{path}' (from config=) is not UTF-8 text: byte 0x{err.object[err.start]:02x} at line "
                f"{line}, column {column}; save the file as UTF-8.")
    key = getattr(err, "full_key", None)
    first = (getattr(err, "msg", None) or str(err)).strip().splitlines()[0]
    if key and "GrammarParse" in type(err).__name__:
        return (f"Config file '{path}' (from config=): '{key}' holds a malformed ${{...}} interpolation ({first}); "
                f"write ${{section.key}} with its closing brace, or quote the value if the '$' is meant literally.")
    return f"Config file '{path}' (from config=) cannot be read: {first}"


def check_top_level(path: str) -> None:
    """Refuse a YAML file (already parsed once by OmegaConf) whose top level is a single value: OmegaConf reads the
    word ``cpu_demo`` as the key ``cpu_demo:``, which would be reported as an unknown key.

    Raises:
        ConfigError: naming the file and the type found.
    """
    import yaml

    with open(path, encoding="utf-8") as f:
        top = yaml.safe_load(f)
    if top is not None and not isinstance(top, dict):
        shown = "" if isinstance(top, list) else f" ({top!r})"
        raise ConfigError(f"Config file '{path}' (from config=) holds a {type(top).__name__} at the top level{shown}; "
                          "it must be a mapping of sections (data:, algorithm:, worker:, trainer:).")


def resolve_error(err: Exception, merged: Any, valid: dict[str, bool]) -> str:
    """The one line for a ``${...}`` that ``OmegaConf.to_container`` could not resolve, naming the key, the
    interpolation and what to write instead."""
    from omegaconf import OmegaConf

    key = getattr(err, "full_key", None) or "?"
    text = str(getattr(err, "msg", None) or err)
    raw = OmegaConf.to_container(merged, resolve=False)
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    given = f"'{key}' = {raw!r}" if isinstance(raw, str) and "${" in raw else f"'{key}'"
    if m := _MISSING_KEY.search(text):
        close = difflib.get_close_matches(m.group(1), list(valid), n=2, cutoff=0.6)
        hint = f" such as ${{{close[0]}}}" if close else ""
        return (f"{given}: ${{{m.group(1)}}} names no config key; write the value itself, or refer to an existing "
                f"key{hint}.")
    if m := _MISSING_ENV.search(text):
        return (f"{given}: the environment variable {m.group(1)} is not set; export it, give a default "
                f"(${{oc.env:{m.group(1)},<default>}}), or write the value itself.")
    if "Recursive interpolation" in text:
        return f"{given} refers back to itself through other interpolations; write a value in one of them."
    if m := _RESOLVER.search(text):
        return (f"{given}: unknown resolver {m.group(1)}; easyrl resolves ${{section.key}} and ${{oc.env:NAME}}, or "
                "write the value itself.")
    first = text.strip().splitlines()[0].rstrip(".")
    return f"{given} cannot be resolved ({first}); write the value itself."


def yaml_hint(path: str, line: Optional[int], problem: str, context_line: Optional[int] = None) -> str:
    """What to write instead, for a YAML syntax error at 1-based ``line`` of ``path`` (``problem``: PyYAML's words;
    ``context_line``: where the construct it could not finish starts)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    tabs = [i + 1 for i, text in enumerate(lines) if "\t" in text[:len(text) - len(text.lstrip())]]
    if tabs and (line in tabs or "cannot start any token" in problem):
        where = ", ".join(str(n) for n in tabs[:5])
        return f"YAML indents with spaces, not tabs: replace the tab(s) at the start of line(s) {where} with spaces"
    for opening, closing in (("[", "]"), ("{", "}")):
        if f"'{closing}'" in problem:
            start = f" opened on line {context_line}" if context_line else ""
            return (f"close the '{opening}'{start} with '{closing}' (items separated by ', '), or "
                    "quote the value if the bracket is part of a string")
    return ("write 'key: value' pairs indented with spaces, one per line, and quote a value that holds ': ', ' #', "
            "'[' or '{' (e.g. key: \"a: b\")")
