"""Stopping a run cleanly on SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C).

The first signal only sets a flag: the trainer finishes the step it is in, saves a checkpoint and returns (the
command then exits with ``128 + signal``, e.g. 143 for SIGTERM, so schedulers see it did not finish). A second signal
exits at once with the same status, without saving.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Optional

logger = logging.getLogger("easyrl.trainer")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Installs the handlers inside (main thread only) and restores the previous ones; ``signum``: the first signal
    received, or None."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            logger.error("second %s: exiting now without saving", name)
            os._exit(128 + signum)
        self.signum = signum
        logger.warning("%s received: finishing this step, saving a checkpoint, then stopping (send it again to "
                       "exit at once)", name)

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
