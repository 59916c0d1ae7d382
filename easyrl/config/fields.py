"""What the config sections' fields share, and their validation. A field states its own type, range (``n: Annotated[int,
POSITIVE]``, ``annotated_types`` constraints, with an optional :class:`Note` for the message), ``Literal`` choices or
registry (:func:`registered`); ``auto`` marks a key derived from another one, :func:`input_path` a key that names an
input file. :func:`validate` checks a merged layer of values against them all at once with pydantic, and words its
first error as one line: the key, the value, what is allowed (with a "did you mean" for a name) and an example."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import typing
from dataclasses import field
from typing import Annotated, Any, Callable, Optional, Union

from annotated_types import Ge, Gt, Interval, Predicate

from easyrl.errors import ConfigError

POSITIVE = Gt(0)
NON_NEGATIVE = Ge(0)
FRACTION = Interval(gt=0, le=1)
UNIT = Interval(ge=0, le=1)
_RANGES = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number", "predicate_failed")


class Note(str):
    """A field's note, added in parentheses to its range in the message (pydantic ignores it)."""


def _positive_or_off(value: Any) -> bool:
    """a positive number, or -1"""
    return value == -1 or value > 0


POSITIVE_OR_OFF = Predicate(_positive_or_off)
"""A count where -1 means "off" or "all" (``trainer.val_freq``, ``data.val_batch_size``)."""


class AllowInf:
    """A float field that may be ``inf`` (every other float must be finite)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return {**handler(source), "allow_inf_nan": True}


def registered(module: str, name: str) -> Any:
    """A name held by the registry (or tuple) ``name`` of ``module`` (imported when a value is checked)."""
    from pydantic import AfterValidator
    from pydantic_core import PydanticCustomError

    def check(value: str) -> str:
        choices = [str(c) for c in getattr(importlib.import_module(module), name)]
        if value not in choices:
            raise PydanticCustomError("choice", "not a registered name", {"choices": choices})
        return value
    return AfterValidator(check)


def auto(source: str, default: Any = None) -> Any:
    """A field derived from ``source``; users cannot set it (see ``PPOConfig.finalize``)."""
    return field(default=default, metadata={"auto": source})


def input_path(default: Any = None, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field that names an input file or folder (a list of them; a ``file.py:function`` by its file part): a
    relative value written in a config file is looked up from the file's folder (``easyrl.config.loading``)."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"input_path": True})
    return field(default=default, metadata={"input_path": True})


def input_path_keys(cls: type) -> tuple[str, ...]:
    """Dotted names of the :func:`input_path` fields of ``cls`` (recursively), in field order."""
    return tuple(key for key, f, _ in _fields(cls) if f.metadata.get("input_path"))


def _fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, bool]]:
    """``(dotted key, field, whether it is a section)`` of every field below dataclass ``cls``, sections first."""
    found = []
    for f in dataclasses.fields(cls):
        sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        found.append((prefix + f.name, f, dataclasses.is_dataclass(sub)))
        found += _fields(type(sub), f"{prefix}{f.name}.") if dataclasses.is_dataclass(sub) else []
    return found


def auto_keys(cls: type) -> dict[str, str]:
    """Dotted names of the auto fields of ``cls`` (recursively) -> the key they are derived from."""
    return {key: f.metadata["auto"] for key, f, _ in _fields(cls) if "auto" in f.metadata}


@functools.cache
def section_mappings(cls: type, prefix: str = "") -> dict[str, type]:
    """Dotted names of the fields of ``cls`` (recursively) that map names to sections (``dict[str, <dataclass>]``,
    e.g. ``worker.teachers``) -> the sections' class; each entry's keys are checked as that class's."""
    found: dict[str, type] = {}
    for name, hint in typing.get_type_hints(cls).items():
        hint = _bare(hint)
        args = typing.get_args(hint) if typing.get_origin(hint) is dict else ()
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):
            found[prefix + name] = args[1]
        elif dataclasses.is_dataclass(hint):
            found.update(section_mappings(hint, f"{prefix}{name}."))
    return found


def valid_keys(cls: type) -> dict[str, bool]:
    """All dotted keys of ``cls`` -> whether the key holds a free-form dict (its children are not checked)."""
    return {key: not section and "dict" in str(f.type) for key, f, section in _fields(cls)}


def validate(values: Any, cls: type, prefix: str = "", source: Callable[[str], Optional[str]] = lambda _: None) -> Any:
    """``values`` (a nested dict of some of ``cls``'s fields; the others keep their defaults) as a ``cls`` instance,
    every type, range and choice checked, every float finite (but where :class:`AllowInf`); ``prefix`` is the dotted
    key of ``cls``, ``source`` where the values came from (both for the message). Raises ``ConfigError`` for the first
    bad value, e.g. ``algorithm.kl_type='fixd' is not one of: fixed, adaptive. Did you mean: fixed?``.
    """
    from pydantic import ValidationError

    try:
        checked = _adapter(cls).validate_python(values)
    except ValidationError as err:
        raise ConfigError(_message(err.errors()[0], cls, prefix, source)) from None
    return cls(**vars(checked))  # the class itself, not _adapter's subclass (which Ray could not unpickle)


@functools.cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    # YAML numbers are read into string fields as OmegaConf did ("0.05" for a threshold, "1800" for an env var)
    checked = type(cls.__name__, (cls,), {"__pydantic_config__": {"allow_inf_nan": False,
                                                                   "coerce_numbers_to_str": True}})
    return TypeAdapter(checked)  # ~0.3 s for PPOConfig: built by the first load_config, not on --help


def _message(error: dict, cls: type, prefix: str, source: Callable[[str], Optional[str]]) -> str:
    kind, value, loc = error["type"], error["input"], error["loc"]
    if kind in ("missing", "too_short", "too_long") and isinstance(loc[-1], int):
        loc = loc[:-1]  # a list of the wrong length: name the list
    key = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)[1:]
    hint, where = _hint(cls, loc), source(key.split("[")[0])
    where = f" (from {where})" if where else ""
    if kind in ("literal_error", "choice"):
        choices = error["ctx"]["choices"] if kind == "choice" else [str(c) for c in typing.get_args(_bare(hint))]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        did_you_mean = f" Did you mean: {close[0]}?" if close else ""
        return f"{key}={value!r} is not one of: {', '.join(choices)}.{did_you_mean}"
    if kind in _RANGES:
        return f"{key} must be {_allowed(hint)}, got {value!r}."
    example = expected(cls, loc, key)
    if value is None:
        return (f"'{key}'{where} has no value (empty or null); write {example}, or leave the key out to keep its "
                "default.")
    length = f" (length {len(value)})" if kind in ("missing", "too_short", "too_long") else ""
    value = list(value) if isinstance(value, tuple) else value
    return f"Bad value for '{key}'{where}: got {value!r}{length}; write {example}."


def _hint(cls: type, loc: tuple) -> Any:
    """The annotation (``Annotated`` kept) of the field at ``loc`` (pydantic's error location) below ``cls``; None
    where ``loc`` leaves the dataclasses."""
    hint: Any = cls
    for part in loc:
        hint = _bare(hint)
        if isinstance(part, int):
            hint = typing.get_args(hint)[part] if typing.get_origin(hint) is tuple else None
        elif typing.get_origin(hint) is dict:  # a named entry of a mapping (worker.teachers.<name>)
            hint = typing.get_args(hint)[1]
        elif dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint, include_extras=True).get(part)
        else:
            return None
    return hint


def _required(hint: Any) -> Any:
    if typing.get_origin(hint) is Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _bare(hint: Any) -> Any:
    """``hint`` without ``Optional`` and ``Annotated``."""
    hint = _required(hint)
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def _allowed(hint: Any) -> str:
    """``a positive number``, ``in (0, 1]``, ``0 or more (or null)``, ... from the field's constraints."""
    metadata = typing.get_args(_required(hint))[1:]
    bounds = {k: getattr(m, k) for m in metadata for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None}
    low, high = bounds.get("gt", bounds.get("ge")), bounds.get("lt", bounds.get("le"))
    words = next((m.func.__doc__ for m in metadata if isinstance(m, Predicate)), None)
    if words is None and not bounds:
        words = "a finite number"
    elif words is None and bounds == {"gt": 0}:
        words = "a positive number"
    elif words is None and high is None:
        words = f"{low} or more" if "ge" in bounds else f"greater than {low}"
    elif words is None:
        words = f"in {'(' if 'gt' in bounds else '['}{low}, {high}{']' if 'le' in bounds else ')'}"
    notes = [m for m in metadata if isinstance(m, Note)]
    notes += ["or null"] if hint is not _required(hint) and not any("null" in note for note in notes) else []
    return words + "".join(f" ({note})" for note in notes)


def _describe(hint: Any) -> str:
    """``an integer``, ``a number``, ``true or false``, ``a list``, ... for a type hint."""
    bare = _bare(hint)
    origin = typing.get_origin(bare)
    if origin is tuple:
        described = f"a list of {len(typing.get_args(bare))} values"
    elif origin is list or origin is dict:
        described = "a list" if origin is list else "a mapping"
    else:
        described = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(bare, "a value")
    return described + (" (or null)" if _required(hint) is not hint else "")


def _cli_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_cli_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_cli_value(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def expected(cls: type, loc: tuple, key: str) -> str:
    """``an integer, e.g. data.max_prompt_length=1024 (the default)``: what the field at ``loc`` below ``cls`` (dotted
    ``key``) holds, its default as the example."""
    default: Any = cls()
    for part in loc:
        default = getattr(default, part, None) if isinstance(part, str) else None
    described = _describe(_hint(cls, loc))
    if default is None or default == "":
        return described
    return f"{described}, e.g. {key}={_cli_value(default)} (the default)"
