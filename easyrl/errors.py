"""Mistakes a user can fix: one short message naming the culprit (key, file, row, column, rank) and what to do.

Raise a :class:`UserError` (or a kind below; all are ``ValueError`` subclasses) where the cause is the user's input; the
commands print ``easyrl: <kind> error: <message>`` on stderr and exit with status 2, without a traceback
(``EASYRL_DEBUG=1`` re-raises). A bad environment variable (``easyrl.envvars.EnvValueError``, kind ``env``) is
printed the same way. Anything else keeps its traceback. ``docs/errors.md`` lists every message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Callable, Optional, Union

from easyrl import envvars


class UserError(ValueError):
    """A mistake the user can fix; ``kind`` (default: the class's) is the word after ``easyrl:``."""

    kind = "input"

    def __init__(self, message: str, kind: Optional[str] = None):
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        return self.message


class ConfigError(UserError):
    """A configuration mistake: unknown or auto key, a value out of range, values that do not fit together."""

    kind = "config"


class DataError(UserError):
    """A data mistake: missing/empty file or folder, malformed JSON line, undecodable image, missing answer."""

    kind = "data"


class ModelError(UserError):
    """A model mistake: ``model_path`` that does not exist, lacks ``config.json``, or cannot be reached on the hub."""

    kind = "model"


class RewardError(UserError):
    """A reward-function mistake: file, function, keyword arguments or declared ``reward_type`` do not fit."""

    kind = "reward"


class RunStateError(UserError):
    """The run folder or checkpoint cannot be used as asked (another run's, an incomplete checkpoint)."""

    kind = "run"


def check_signature(fn: Callable, key: str, spec: str, called_as: str) -> None:
    """Check that a user function can be called with one positional argument (``called_as``, e.g. ``fn(verdict)``);
    ConfigError naming ``key``, ``spec``, the signature and the call."""
    import inspect

    try:
        inspect.signature(fn).bind(None)
    except TypeError as err:
        raise ConfigError(f"{key}={spec!r}: {fn.__name__}{inspect.signature(fn)} cannot be called as "
                          f"{called_as} ({err}); give it exactly one required argument.") from None
    except ValueError:  # a builtin without a signature: called as is
        pass


def import_user_file(path: str) -> Optional[ModuleType]:
    """The module of the user's Python file ``path`` (a reward function, tool, parser, environment), imported once per
    process under a name from its absolute path (two ``math.py`` files neither clash nor shadow the stdlib); None when
    it cannot be imported as Python. Raises what the file's code raises (and forgets the failed import)."""
    name = "easyrl_user_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[name])
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def user_error_of(err: BaseException) -> Optional[Union[UserError, envvars.EnvValueError]]:
    """The :class:`UserError` (or bad environment variable) behind ``err``: itself, a Ray task error's cause, or an
    explicit ``raise ... from``."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, (UserError, envvars.EnvValueError)) and type(err).__module__ != "ray.exceptions":
            return err
        cause = getattr(err, "cause", None)  # ray.exceptions.RayTaskError keeps the remote exception here
        err = cause if isinstance(cause, BaseException) else err.__cause__
        seen += 1
    return None


def _debugging() -> bool:
    """Whether ``EASYRL_DEBUG`` is on; a bad value reads as off here, so that its own error is printed as one line."""
    try:
        return envvars.debug(os.environ)
    except envvars.EnvValueError:
        return False


def run_cli(main: Callable[[], int]) -> int:
    """``main()``'s exit status, or 2 after printing a :class:`UserError`'s line on stderr (other exceptions, and
    user errors under ``EASYRL_DEBUG=1``, propagate)."""
    try:
        return main()
    except Exception as err:
        user_error = user_error_of(err)
        if user_error is None or _debugging():
            raise
        print(f"easyrl: {user_error.kind} error: {user_error.message}", file=sys.stderr)
        return 2
