"""Building a ``PPOConfig`` from command-line words: defaults <- YAML (``config=``) <- dotted overrides, unknown and
auto keys refused before any merge (``load_config``), and ``to_dict``. A config file's relative input paths are looked
up in the file's folder, the current folder, then the file's parent folders (docs/config.md, "Relative paths"). Each
malformed word, YAML file or interpolation gets one line naming the culprit and what to write instead (docs/errors.md,
"Malformed words, files and values"). A key repeated on the command line: the later word wins; inside a YAML mapping:
PyYAML's "found duplicate key"."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
from typing import Any, Optional

from omegaconf import OmegaConf

from easyrl.config.aliases import MISSING, apply_aliases, get_key, pop_key, set_key
from easyrl.config.checks import check_config, warn_config_traps
from easyrl.config.fields import auto_keys, expected, input_path_keys, section_mappings, valid_keys, validate
from easyrl.config.ppo import PPOConfig
from easyrl.config.verl_keys import VERL_SECTIONS, section_hint, verl_hints
from easyrl.errors import ConfigError


def _check_keys(user: dict, source: str, valid: dict[str, bool], autos: dict[str, str], prefix: str = "",
                unknown: Optional[list[tuple[str, str]]] = None) -> None:
    """Refuse the keys of one layer ``user`` (from ``source``) that are unknown (all of them in one error, each with
    its "did you mean", or for verl's keys what easyrl has instead: ``easyrl.config.verl_keys``), derived
    automatically, a section given a plain value or none, or a mapping given for a key that holds one value
    (``data.max_prompt_length={a: 1}``)."""
    found: list[tuple[str, str]] = [] if unknown is None else unknown  # (key, its hint: "" or "did you mean: ...")
    mappings = section_mappings(PPOConfig)
    for key, value in user.items():
        name = f"{prefix}{key}"
        if name in mappings and isinstance(value, dict):  # named sections (worker.teachers.<name>): each one's keys
            for entry, keys in value.items():
                if not isinstance(keys, dict):
                    raise ConfigError(f"'{name}.{entry}' (from {source}) is a section: give a mapping of its keys, "
                                      f"got {keys!r}.")
                entry_keys = {f"{name}.{entry}.{k}": v for k, v in valid_keys(mappings[name]).items()}
                _check_keys(keys, source, {**valid, **entry_keys}, autos, f"{name}.{entry}.", found)
            continue
        if name not in valid:
            verl, rest = verl_hints(name, value)
            found.extend(verl)
            if rest and name.split(".")[0] in VERL_SECTIONS:
                found.append((name, section_hint(rest)))
            elif rest:
                settable = [k for k in valid if k not in autos]
                close = difflib.get_close_matches(name, settable, n=3, cutoff=0.6)
                leaf = [k for k in settable if k.rsplit(".", 1)[-1] == str(key)]
                hint = close or leaf[:3]
                found.append((name, f"did you mean: {', '.join(hint)}?" if hint else ""))
            continue
        if name in autos:
            raise ConfigError(
                f"'{name}' (from {source}) is derived automatically from {autos[name]}; set that instead."
            )
        is_section = not valid[name] and any(k.startswith(name + ".") for k in valid)
        if is_section and value is None:
            how = (f"set its keys one by one ({name}.<key>=value), or remove the word" if source == "the command line"
                   else "give its keys indented below it, or remove the line")
            raise ConfigError(f"'{name}' (from {source}) is an empty section: {how}.")
        if is_section and not isinstance(value, dict):
            raise ConfigError(f"'{name}' (from {source}) is a section: give a mapping of its keys, got {value!r}.")
        if isinstance(value, dict) and not valid[name] and not is_section:
            raise ConfigError(f"'{name}' (from {source}) holds one value, not a section: got the mapping {value!r}; "
                              f"write {expected(PPOConfig, tuple(name.split('.')), name)}.")
        if isinstance(value, dict) and not valid[name]:
            _check_keys(value, source, valid, autos, name + ".", found)
    if unknown is None and len(found) == 1:
        name, hint = found[0]
        if hint.startswith("did you mean") or not hint:
            raise ConfigError(f"Unknown config key '{name}' (from {source})." + (f" {hint[:1].upper()}{hint[1:]}"
                                                                                 if hint else ""))
        raise ConfigError(f"Unknown config key '{name}' (from {source}): {hint}.")  # verl's (easyrl.config.verl_keys)
    if unknown is None and found:
        listed = "; ".join(f"'{name}'" + (f" ({hint})" if hint else "") for name, hint in found)
        raise ConfigError(f"{len(found)} unknown config keys (from {source}): {listed}.")


def _load_yaml(path: str) -> dict:
    """The mapping in the YAML file at ``path``; raises ``ConfigError`` naming the file (and line) otherwise."""
    import yaml

    try:
        conf = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark, context = getattr(err, "problem_mark", None), getattr(err, "context_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context_line = context.line + 1 if context is not None else None
        if context is not None and getattr(err, "context", None) and context.line != getattr(mark, "line", None):
            problem += f" ({err.context} that starts at line {context.line + 1})"
        hint = yaml_hint(path, mark.line + 1 if mark is not None else None, problem, context_line)
        raise ConfigError(f"Config file '{path}' (from config=) is not valid YAML:{where}: {problem}: {hint}.") \
            from None
    except Exception as err:  # omegaconf's own errors (e.g. a malformed ${...}), a file that is not UTF-8
        raise ConfigError(read_error(err, path)) from None
    check_top_level(path)
    return OmegaConf.to_container(conf) or {}


def load_config(argv: list[str]) -> PPOConfig:
    """A finalized ``PPOConfig`` (auto keys filled in, every value checked) from ``argv`` (``["config=path.yaml",
    "a.b=1", ...]``, ``config=`` optional and at most once); settings that differ from their paper's meaning are
    warned of (``ConfigWarning``). Raises ``ConfigError``: unknown or auto key, malformed override, missing or
    malformed YAML file, value of the wrong type or out of range."""
    yaml_path = check_words(argv)
    overrides = [word for word in argv if not word.startswith("config=")]

    valid, autos = valid_keys(PPOConfig), auto_keys(PPOConfig)
    merged = OmegaConf.create(dataclasses.asdict(PPOConfig()))  # untyped: pydantic checks the merged values once
    layers = []
    if yaml_path is not None:
        if not os.path.isfile(yaml_path):
            raise ConfigError(f"Config file '{yaml_path}' (from config=) does not exist (looked for "
                              f"{os.path.abspath(yaml_path)!r}): write config=<path of an existing YAML file>, e.g. "
                              "config=config.yaml from the repository root, or leave config= out for the defaults.")
        layers.append((resolve_config_paths(_load_yaml(yaml_path), yaml_path), f"file {yaml_path}", None))
    for word in overrides:  # one word at a time, so that a grammar error names its word
        try:
            OmegaConf.from_dotlist([word])
        except Exception as e:  # omegaconf's / PyYAML's grammar errors
            reason = " ".join(str(e).strip().splitlines()[:2]).rstrip(".")
            raise ConfigError(f"Could not parse the command-line word '{word}': {reason}. Write the value as YAML "
                              "(a number, a word, [a,b] or {k: v}), its brackets and quotes closed.") from None
    cli_whole_keys = {word.split("=", 1)[0] for word in overrides}
    layers.append((OmegaConf.to_container(OmegaConf.from_dotlist(overrides)), "the command line", cli_whole_keys))

    free_dicts = [key for key, is_dict in valid.items() if is_dict]
    sources = []
    for layer, source, whole_keys in layers:
        layer = apply_aliases(layer or {}, source)  # EasyR1's keys -> easyrl's (easyrl/config/aliases.py)
        _check_keys(layer, source, valid, autos)
        sources.append((copy.deepcopy(layer), source))
        # A free-form dict given whole by a later layer replaces the earlier one instead of merging into it, so that
        # worker.reward.reward_function_kwargs={} really drops the YAML's kwargs. A YAML gives dicts whole; on the
        # command line only `key={...}` does, while `key.sub=value` merges into the dict.
        replaced = {key: pop_key(layer, key) for key in free_dicts
                    if get_key(layer, key) is not MISSING and (whole_keys is None or key in whole_keys)}
        merged = OmegaConf.merge(merged, layer)
        for key, value in replaced.items():
            OmegaConf.update(merged, key, value, merge=False)
    try:
        values = OmegaConf.to_container(merged, resolve=True)
    except Exception as e:  # a ${...} that cannot be resolved
        raise ConfigError(resolve_error(e, merged, valid)) from None
    config: PPOConfig = validate(values, PPOConfig, source=lambda key: next(
        (source for layer, source in reversed(sources) if get_key(layer, key) is not MISSING), None))
    config.finalize()
    check_config(config)
    warn_config_traps(config)
    return config


def to_dict(config: PPOConfig) -> dict:
    """The configuration as a plain nested dict (for logging and saving)."""
    return dataclasses.asdict(config)


_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")
_MISSING_ENV = re.compile(r"Environment variable '([^']+)' not found")
_RESOLVER = re.compile(r"Unsupported interpolation type (\S+)")


def check_words(argv: list[str]) -> Optional[str]:
    """Refuse command-line words that cannot mean anything: no ``key=value``, ``=value`` without a key, an empty
    ``config=``, ``config=`` given twice or naming a folder (``ConfigError`` naming the word and what to write
    instead); returns the ``config=`` file (None: none)."""
    configs = [word.split("=", 1)[1] for word in argv if word.startswith("config=")]
    for word in argv:
        if word.startswith("="):
            raise ConfigError(f"Command-line word '{word}' has no key before '=': write key=value, e.g. "
                              f"data.max_prompt_length{word}.")
        if "=" not in word:
            raise ConfigError(f"Command-line argument '{word}' is not of the form key=value (see --help).")
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
    return configs[0] if configs else None


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
    """Refuse (``ConfigError`` naming the file and the type found) a YAML file whose top level is a single value:
    OmegaConf reads the word ``cpu_demo`` as the key ``cpu_demo:``, which would be reported as an unknown key."""
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


def search_folders(config_file: str, cwd: Optional[str] = None) -> list[str]:
    """Where a relative path of ``config_file`` is looked up, in order (see the module docstring)."""
    here = os.path.dirname(os.path.abspath(config_file))
    folders = [here, os.path.abspath(cwd or os.getcwd())]
    parent = os.path.dirname(here)
    while parent != here:
        folders.append(parent)
        here, parent = parent, os.path.dirname(parent)
    return list(dict.fromkeys(folders))


def resolve_path(value: str, folders: list[str]) -> str:
    """``value`` as an absolute path under the first of ``folders`` where it exists; unchanged when it is absolute,
    starts with ``~``, or exists nowhere. A ``file.py:function`` value is resolved by its file part."""
    path, suffix = value, ""
    if ".py:" in value:  # worker.reward.reward_function: path.py:function
        path, function = value.rsplit(":", 1)
        suffix = ":" + function
    if os.path.isabs(path) or path.startswith("~") or not path:
        return value
    for folder in folders:
        candidate = os.path.join(folder, path)
        if os.path.exists(candidate):
            return os.path.normpath(candidate) + suffix
    return value


def resolve_config_paths(layer: dict[str, Any], config_file: str, cwd: Optional[str] = None) -> dict[str, Any]:
    """Resolve the relative input paths (the keys of the fields marked :func:`~easyrl.config.fields.input_path`, every
    role's model and tokenizer among them) of the YAML layer ``layer`` read from ``config_file``, in place (each item
    of a list, e.g. ``multi_turn.tools``); returns ``layer``."""
    folders = search_folders(config_file, cwd)
    keys = list(input_path_keys(PPOConfig))
    for mapping, cls in section_mappings(PPOConfig).items():  # each named section's paths (worker.teachers.<name>)
        entries = get_key(layer, mapping)
        keys += [f"{mapping}.{entry}.{key}" for entry in (entries if isinstance(entries, dict) else {})
                 for key in input_path_keys(cls)]
    for key in keys:
        value = get_key(layer, key)
        if isinstance(value, str):
            set_key(layer, key, resolve_path(value, folders))
        elif isinstance(value, list):
            set_key(layer, key, [resolve_path(item, folders) if isinstance(item, str) else item for item in value])
    return layer
