"""A name -> function registry, the one behind :data:`~easyrl.algorithms.advantages.ADV_ESTIMATORS` and
:data:`~easyrl.algorithms.policy_losses.POLICY_LOSSES`.

A configuration key names an entry (``algorithm.adv_estimator``, ``worker.actor.loss_type``); the module that defines
the function registers it with the decorator, and the caller looks it up with :meth:`Registry.get`::

    ADV_ESTIMATORS = Registry("advantage estimator")

    @ADV_ESTIMATORS.register("grpo")
    def grpo_advantage(inputs): ...

    ADV_ESTIMATORS.get("grpo")(inputs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions registered by name, in registration order.

    ``name in registry``, ``list(registry)`` (the names) and ``len(registry)`` work as for a dict's keys.

    Args:
        kind: what an entry is, for error messages (``"advantage estimator"``, ``"policy loss"``).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding the function under ``name``; it returns the function unchanged.

        Raises:
            ValueError: if ``name`` is already taken by a different function (registering the same one again is a
                no-op, e.g. when a module is reloaded).
        """

        def decorator(fn: F) -> F:
            taken = self._entries.get(name)
            if taken is not None and taken is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered ({taken!r})")
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered as ``name``.

        Raises:
            ValueError: if ``name`` is unknown; the message lists the valid names.
        """
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
