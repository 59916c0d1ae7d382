"""Model folder or hub id: where a worker reads the model from, downloaded before any collective waits on it.

Every worker resolves a hub id to this node's snapshot folder (:func:`local_model_path`) BEFORE the process group
exists, so a long download never hits ``worker.nccl_timeout``. Workers of one node share the hub cache and its file
locks; each node downloads its own copy.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Optional

__all__ = ["HUB_ID", "looks_local", "local_model_path", "snapshot_download"]

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local folder rather than a hub id ``org/name``: it exists, starts with ``/ . ~``,
    or is not of the hub's ``name`` / ``org/name`` form (e.g. ``models/qwen/7b``)."""
    return os.path.exists(os.path.expanduser(path)) or path.startswith(("/", ".", "~")) or not HUB_ID.match(path)


def snapshot_download(repo_id: str) -> str:
    """``huggingface_hub.snapshot_download(repo_id)``: the local snapshot folder of a hub model (downloaded into the
    hub cache if needed; only the cache under ``HF_HUB_OFFLINE=1``)."""
    import huggingface_hub

    return huggingface_hub.snapshot_download(repo_id)


def local_model_path(path: Optional[str], download: Optional[Callable[[str], str]] = None) -> Optional[str]:
    """The local folder to read a model (or tokenizer) ``path`` from: ``path`` itself when it is None (unset) or local
    (:func:`looks_local`; ``~`` expanded), else ``download(path)`` (``hub id -> folder``, :func:`snapshot_download`)."""
    if path is None:
        return None
    if looks_local(path):
        return os.path.expanduser(path)
    return (download or snapshot_download)(path)
