"""The model cache (``$EASYRL_CACHE``, default ``~/.cache/easyrl``) and an atomic, race-safe way to fill it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def cache_root() -> Path:
    """``$EASYRL_CACHE`` (default ``~/.cache/easyrl``): where built and converted models are kept."""
    from easyrl.envvars import cache_dir

    return Path(cache_dir(os.environ))


def build_atomically(final: Path, is_complete: Callable[[Path], bool], write: Callable[[Path], None]) -> Path:
    """Fill folder ``final`` once with ``write(tmp)``, safely against concurrent builders and interrupted builds.

    ``write`` fills a fresh temporary sibling folder, which is then renamed to ``final``: a reader never sees a half
    written folder. If ``is_complete(final)`` already holds, nothing is built. A stale or partial ``final`` is moved
    aside and replaced; a loser of a race deletes its copy and returns the winner's.

    Returns:
        ``final``.

    Raises:
        OSError: the rename failed and ``final`` is not complete either; whatever ``write`` raises.
    """
    if is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        write(tmp)
        if final.exists() and not is_complete(final):  # stale or partial: move aside, then replace
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
            try:
                os.rename(final, stale / "old")
            except OSError:
                pass  # someone else moved it first
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final):  # the folder that won the race must be usable
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
