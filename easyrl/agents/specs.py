"""Import a user function named ``path/to/file.py:function`` (tools, tool-call parsers, environments)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Callable

from easyrl.errors import ConfigError, check_signature

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
    module_name = "easyrl_agent_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    if module_name not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ConfigError(f"{key}={spec!r}: {path!r} cannot be imported (is it a .py file?).")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - the user's file: named with its error
            del sys.modules[module_name]
            raise ConfigError(f"{key}={spec!r}: importing {path!r} failed: {type(err).__name__}: {err}") from None
    fn = getattr(sys.modules[module_name], name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(sys.modules[module_name]).items()
                       if callable(v) and not k.startswith("_") and getattr(v, "__module__", "") == module_name)
        raise ConfigError(f"{key}={spec!r}: {path!r} has no function {name!r}; its functions: {found}.")
    if called_as:
        check_signature(fn, key, spec, called_as)
    return fn

