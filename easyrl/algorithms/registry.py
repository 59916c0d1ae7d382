"""A name -> function registry (behind ``ADV_ESTIMATORS`` and ``POLICY_LOSSES``) with traits per entry, so that no
caller compares names::

    ADV_ESTIMATORS = Registry("advantage estimator", group=False)

    @ADV_ESTIMATORS.register("grpo", group=True)
    def grpo_advantage(inputs): ...

    ADV_ESTIMATORS.get("grpo")(inputs); ADV_ESTIMATORS.trait("grpo", "group")  # True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions by name, in registration order (``in``, ``list()`` as for a dict's keys); ``kind`` names
    an entry in errors, ``**defaults`` are the traits an entry may declare and their default values."""

    def __init__(self, kind: str, **defaults: Any):
        self.kind = kind
        self.defaults = defaults
        self._entries: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator adding the function under ``name``. ValueError if ``name`` is taken by another function
        (the same one again is a no-op) or a trait is unknown."""
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
        """The function registered as ``name``; ValueError listing the valid names if it is unknown."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {self.names()}")
        return self._entries[name]

    def trait(self, name: str, trait: str) -> Any:
        """``trait`` of entry ``name``, the default for an unknown name (config checks read it before checking the
        name); KeyError for an unknown trait."""
        return self._traits.get(name, self.defaults)[trait]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
