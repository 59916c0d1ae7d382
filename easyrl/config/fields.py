"""Field helpers shared by the config sections: ``auto`` marks a key derived from another one."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def auto(source: str, default: Any = None) -> Any:
    """A field derived from ``source``; users cannot set it (see ``PPOConfig.finalize``)."""
    return field(default=default, metadata={"auto": source})
