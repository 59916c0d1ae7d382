"""The one rule for mistakes a user can fix: one short message that names the culprit and what to do.

Raise a :class:`UserError` (or one of its kinds below) wherever the cause is the user's input: a config key, a data
file or row, a model folder, a reward function, a run folder. ``python -m easyrl.trainer`` prints it as::

    easyrl: <kind> error: <message>

on stderr and exits with status 2, without a traceback (``EASYRL_DEBUG=1`` re-raises it with the traceback). Anything
else is a bug of easyrl or a library and keeps its traceback. The message should name the key / file / row / column /
rank and say what to change; ``docs/errors.md`` lists every such message with the test that checks it.

The kinds also derive from ``ValueError`` so that code catching ``ValueError`` around a load keeps working.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

EXIT_USER_ERROR = 2
DEBUG_ENV = "EASYRL_DEBUG"


class UserError(ValueError):
    """A mistake the user can fix (bad config value, data row, model folder, reward function, ...).

    Args:
        message: what is wrong, naming the culprit (key, file, row, column, rank), and what to do.
        kind: the word after ``easyrl:`` in the printed message (``config``, ``data``, ``model``, ``reward``, ...);
            defaults to the class's ``kind``.
    """

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
    """The run folder or checkpoint cannot be used as asked (another run's metrics or checkpoints, an incomplete
    checkpoint): the message says what to do. Printed as ``easyrl: run error: ...`` (exit status 2)."""

    kind = "run"


def check_signature(fn: Callable, key: str, spec: str, called_as: str) -> None:
    """A user function (a tool-call parser, an environment, a judge's verdict parser) can be called with one
    positional argument, as ``called_as`` shows (e.g. ``fn(verdict)``).

    Raises:
        ConfigError: naming ``key``, ``spec``, the signature and the call.
    """
    import inspect

    try:
        inspect.signature(fn).bind(None)
    except TypeError as err:
        raise ConfigError(f"{key}={spec!r}: {fn.__name__}{inspect.signature(fn)} cannot be called as "
                          f"{called_as} ({err}); give it exactly one required argument.") from None
    except ValueError:  # a builtin without a signature: called as is
        pass


def debug_enabled() -> bool:
    """Whether ``EASYRL_DEBUG`` asks for tracebacks of user errors (any value but ``""``/``0``/``false``)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def user_error_of(err: BaseException) -> Optional[UserError]:
    """The :class:`UserError` behind ``err``: itself, a Ray task error's cause, or an explicit ``raise ... from``."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, UserError) and type(err).__module__ != "ray.exceptions":
            return err
        cause = getattr(err, "cause", None)  # ray.exceptions.RayTaskError keeps the remote exception here
        err = cause if isinstance(cause, BaseException) else err.__cause__
        seen += 1
    return None


def format_user_error(err: UserError) -> str:
    """The one line printed for ``err``: ``easyrl: <kind> error: <message>``."""
    return f"easyrl: {err.kind} error: {err.message}"


def run_cli(main: Callable[[], int]) -> int:
    """Run ``main()`` and turn a :class:`UserError` into its one-line message on stderr and exit status 2.

    Other exceptions propagate with their traceback. With ``EASYRL_DEBUG=1`` user errors propagate too.

    Returns:
        ``main()``'s exit status, or 2 after a user error.
    """
    try:
        return main()
    except Exception as err:
        user_error = user_error_of(err)
        if user_error is None or debug_enabled():
            raise
        print(format_user_error(user_error), file=sys.stderr)
        return EXIT_USER_ERROR
