"""Building a ``PPOConfig`` from command-line words: defaults <- YAML (``config=``) <- dotted overrides, with
unknown and auto keys refused before any merge (``load_config``), and ``to_dict``."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from typing import Optional

from omegaconf import OmegaConf

from easyrl.config import malformed
from easyrl.config.aliases import MISSING, apply_aliases, get_key, pop_key
from easyrl.config.checks import check_config
from easyrl.config.fields import auto_keys, expected, validate, valid_keys
from easyrl.config.paths import resolve_config_paths
from easyrl.config.ppo import PPOConfig
from easyrl.config.traps import warn_config_traps
from easyrl.errors import ConfigError


def _check_keys(user: dict, source: str, valid: dict[str, bool], autos: dict[str, str], prefix: str = "",
                unknown: Optional[list[tuple[str, list[str]]]] = None) -> None:
    """Refuse the keys of one layer ``user`` (from ``source``) that are unknown (all of them in one error, each with
    its "did you mean"), derived automatically, a section given a plain value or none, or a mapping given for a key
    that holds one value (``data.max_prompt_length={a: 1}``)."""
    found: list[tuple[str, list[str]]] = [] if unknown is None else unknown
    for key, value in user.items():
        name = f"{prefix}{key}"
        if name not in valid:
            settable = [k for k in valid if k not in autos]
            close = difflib.get_close_matches(name, settable, n=3, cutoff=0.6)
            leaf = [k for k in settable if k.rsplit(".", 1)[-1] == str(key)]
            hint = close or leaf[:3]
            found.append((name, hint))
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
        raise ConfigError(f"Unknown config key '{name}' (from {source})."
                          + (f" Did you mean: {', '.join(hint)}?" if hint else ""))
    if unknown is None and found:
        listed = "; ".join(f"'{name}'" + (f" (did you mean: {', '.join(hint)}?)" if hint else "")
                           for name, hint in found)
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
        hint = malformed.yaml_hint(path, mark.line + 1 if mark is not None else None, problem, context_line)
        raise ConfigError(f"Config file '{path}' (from config=) is not valid YAML:{where}: {problem}: {hint}.") \
            from None
    except Exception as err:  # omegaconf's own errors (e.g. a malformed ${...}), a file that is not UTF-8
        raise ConfigError(malformed.read_error(err, path)) from None
    malformed.check_top_level(path)
    return OmegaConf.to_container(conf) or {}


def load_config(argv: list[str]) -> PPOConfig:
    """Build the run configuration from command-line words.

    Args:
        argv: ``["config=path.yaml", "a.b=1", ...]``; ``config=`` is optional and may appear once.

    Returns:
        A finalized ``PPOConfig`` (auto keys filled in, every value checked); settings that run but differ from their
        paper's meaning are warned of (``easyrl.config.traps.ConfigWarning``).

    Raises:
        ConfigError: unknown or auto key, malformed override, missing or malformed YAML file (not a mapping), value
            of the wrong type or out of range (``easyrl.config.checks``).
    """
    malformed.check_words(argv)
    yaml_path = None
    overrides = []
    for word in argv:
        if "=" not in word:
            raise ConfigError(f"Command-line argument '{word}' is not of the form key=value (see --help).")
        if word.startswith("config="):
            yaml_path = word.split("=", 1)[1]
        else:
            overrides.append(word)

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
        raise ConfigError(malformed.resolve_error(e, merged, valid)) from None
    config: PPOConfig = validate(values, PPOConfig, source=lambda key: next(
        (source for layer, source in reversed(sources) if get_key(layer, key) is not MISSING), None))
    config.finalize()
    check_config(config)
    warn_config_traps(config)
    return config


def to_dict(config: PPOConfig) -> dict:
    """The configuration as a plain nested dict (for logging and saving)."""
    return dataclasses.asdict(config)
