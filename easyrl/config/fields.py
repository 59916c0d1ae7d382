"""What the config sections' fields share: ``auto`` marks a key derived from another one; the ranges on a field
(``n: Annotated[int, POSITIVE]``, ``annotated_types`` constraints, with an optional :class:`Note` for the message) are
read by pydantic in :func:`check_fields` once the configuration is merged and finalized. OmegaConf checks the types
and the ``Literal`` choices while it merges (``easyrl.config.malformed.value_error`` words those errors)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import field
from typing import Annotated, Any, Union

from annotated_types import Ge, Gt, Interval, Predicate

from easyrl.errors import ConfigError

POSITIVE = Gt(0)
NON_NEGATIVE = Ge(0)
FRACTION = Interval(gt=0, le=1)
UNIT = Interval(ge=0, le=1)


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


def auto(source: str, default: Any = None) -> Any:
    """A field derived from ``source``; users cannot set it (see ``PPOConfig.finalize``)."""
    return field(default=default, metadata={"auto": source})


def check_fields(values: Any, cls: type, prefix: str = "") -> None:
    """Every range on the fields of dataclass ``cls`` (nested ones included), and every float finite (but where
    :class:`AllowInf`), for ``values``: an instance, or a dict of some of its fields.

    Raises:
        ConfigError: the first value out of range, ``<prefix><key> must be <range> (<note>), got <value>.``
    """
    from pydantic import ValidationError

    if dataclasses.is_dataclass(values):
        values = dataclasses.asdict(values)
    try:
        _adapter(cls).validate_python(values)
    except ValidationError as err:
        error = err.errors()[0]
        key = prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])[1:]
        raise ConfigError(f"{key} must be {_allowed(_hint(cls, error['loc']))}, got {error['input']!r}.") from None


@functools.cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    finite = type(cls.__name__, (cls,), {"__pydantic_config__": {"allow_inf_nan": False}})
    return TypeAdapter(finite)  # ~0.5 s for PPOConfig: built by the first load_config, not on --help


def _hint(cls: type, loc: tuple) -> Any:
    """The annotation (``Annotated`` kept) of the field at pydantic's error location ``loc`` below ``cls``."""
    hint: Any = cls
    for part in loc:
        hint = _required(hint)
        hint = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        hint = typing.get_args(hint)[part] if isinstance(part, int) else \
            typing.get_type_hints(hint, include_extras=True)[part]
    return hint


def _required(hint: Any) -> Any:
    if typing.get_origin(hint) is Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


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
