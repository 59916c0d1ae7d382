"""Import a user function named ``path/to/file.py:function`` (tools, tool-call parsers, environments)."""

from __future__ import annotations

import os
from typing import Callable

from easyrl.errors import ConfigError, check_signature, import_user_file

__all__ = ["load_callable"]


def load_callable(spec: str, key: str, called_as: str = "") -> Callable:
    """The function of ``spec`` (``path/to/file.py:function``), its file imported once per process under a name from
    its absolute path. ``key`` is named in errors; with ``called_as`` (``fn(text)``) it must take one argument.
    ConfigError: a malformed spec, a missing file, a failed import (quoted), no such function (listing the file's),
    or a signature that does not fit ``called_as``."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise ConfigError(f"{key}={spec!r} is not of the form path/to/file.py:function.")
    if not os.path.isfile(path):
        raise ConfigError(f"{key}={spec!r}: no file {path!r}.")
    try:
        module = import_user_file(path)
    except Exception as err:  # noqa: BLE001 - the user's file: named with its error
        raise ConfigError(f"{key}={spec!r}: importing {path!r} failed: {type(err).__name__}: {err}") from None
    if module is None:
        raise ConfigError(f"{key}={spec!r}: {path!r} cannot be imported (is it a .py file?).")
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_") and getattr(v, "__module__", "") == module.__name__)
        raise ConfigError(f"{key}={spec!r}: {path!r} has no function {name!r}; its functions: {found}.")
    if called_as:
        check_signature(fn, key, spec, called_as)
    return fn

