"""A name -> function registry, the one behind :data:`~easyrl.algorithms.advantages.ADV_ESTIMATORS` and
:data:`~easyrl.algorithms.policy_losses.POLICY_LOSSES`.

A configuration key names an entry (``algorithm.adv_estimator``, ``worker.actor.loss_type``); the module that defines
the function registers it with the decorator, and the caller looks it up with :meth:`Registry.get`. What an entry
*is* (group-relative, needs a critic, ...) is a trait given at registration, read with :meth:`Registry.trait`, so that
no caller compares names::

    ADV_ESTIMATORS = Registry("advantage estimator", group=False, needs_critic=False)

    @ADV_ESTIMATORS.register("grpo", group=True)
    def grpo_advantage(inputs): ...

    ADV_ESTIMATORS.get("grpo")(inputs)
    ADV_ESTIMATORS.trait("grpo", "group")  # True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions registered by name, in registration order.

    ``name in registry``, ``list(registry)`` (the names) and ``len(registry)`` work as for a dict's keys.

    Args:
        kind: what an entry is, for error messages (``"advantage estimator"``, ``"policy loss"``).
        **defaults: the traits an entry may declare, with their values for entries that do not.
    """

    def __init__(self, kind: str, **defaults: Any):
        self.kind = kind
        self.defaults = defaults
        self._entries: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator adding the function under ``name`` with its ``traits``; it returns the function unchanged.

        Raises:
            ValueError: if ``name`` is already taken by a different function (registering the same one again is a
                no-op, e.g. when a module is reloaded), or a trait is not one of the registry's.
        """
        unknown = sorted(set(traits) - set(self.defaults))
        if unknown:
            raise ValueError(f"{self.kind} {name!r}: unknown traits {unknown}; known: {sorted(self.defaults)}")

        def decorator(fn: F) -> F:
            taken = self._entries.get(name)
            if taken is not None and taken is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered ({taken!r})")
            self._entries[name] = fn
            self._traits[name] = {**self.defaults, **traits}
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

    def trait(self, name: str, trait: str) -> Any:
        """The value of ``trait`` for the entry ``name``: the registry's default when the entry did not declare it, or
        when ``name`` is unknown (so that a config check may read it before the name is checked).

        Raises:
            KeyError: if ``trait`` is not one of the registry's.
        """
        return self._traits.get(name, self.defaults)[trait]

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
