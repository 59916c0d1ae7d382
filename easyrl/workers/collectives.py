"""The collective contract: every rank issues the same collectives, in the same order, with the same dtypes and
shapes, on a device its backend serves; a mismatch is an error naming the call instead of a hang (docs/environment.md).

:func:`install` wraps torch.distributed's and DTensor's collectives: before each call, every rank posts ``(op, dtype,
shape, device type)`` as call ``#n`` of the group to the store and compares its peers' ``#n``, raising
:class:`CollectiveMismatch` on a difference; :func:`method_end` posts each worker method's end likewise. The wait is
bounded by ``worker.nccl_timeout``. Point-to-point is not checked.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._pytree import tree_leaves

from easyrl import envvars

__all__ = ["ENV", "CollectiveMismatch", "checked_call", "contract_on", "install", "method_end"]

ENV = envvars.CHECK_COLLECTIVES
C10D_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
            "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "gather", "scatter",
            "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "all_gather_object",
            "broadcast_object_list", "gather_object", "scatter_object_list")
FUNCOL_OPS = ("all_reduce", "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
              "all_to_all_single", "broadcast", "all_gather_inplace")
# ops whose tensors may differ in shape (or count) across ranks: only the first tensor's dtype and device are compared
UNEVEN = {"all_gather", "reduce_scatter", "gather", "scatter", "all_to_all", "all_to_all_single",
          "funcol.all_to_all_single"}
OBJECT_OPS = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"}


class CollectiveMismatch(RuntimeError):
    """The ranks of a process group issued different collectives at the same point (what NCCL/HCCL hang on), or a
    tensor sits on a device the group's backend does not serve. The message names the call number, the group, the
    worker method and each rank's ``op(dtype[shape] device)``."""


def contract_on(config_switch: bool) -> bool:
    """Whether the contract is on: ``trainer.check_collectives`` (``config_switch``) or
    ``EASYRL_CHECK_COLLECTIVES`` on in this process (``easyrl.envvars.check_collectives``: ``false`` is off)."""
    return bool(config_switch) or envvars.check_collectives(os.environ)


class _Contract:
    """One process's checker: per group, the number of calls posted so far."""

    def __init__(self) -> None:
        self.store = dist.PrefixStore("easyrl_contract/", dist.distributed_c10d._get_default_store())
        self.calls: dict[str, int] = {}
        self.method = "start-up"
        self.local = threading.local()  # depth of wrapped calls (all_gather_object calls all_gather: checked once)

    def check(self, pg: Any, call: str, raised: bool = False) -> None:
        """Post ``call`` as this rank's next call on ``pg`` and compare it with every peer's same call."""
        if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER or dist.get_world_size(pg) < 2:
            return
        name, me = pg.group_name, dist.get_rank(pg)
        n = self.calls.get(name, 0)
        self.calls[name] = n + 1
        self.store.set(f"{name}/{me}/{n}", call)
        if raised:  # a rank that raised does not wait: its peers read that it left
            return
        if n >= 2:  # every peer has read it: they posted #n-1 after reading #n-2
            self.store.delete_key(f"{name}/{me}/{n - 2}")
        peers = [r for r in range(dist.get_world_size(pg)) if r != me]
        try:
            seen = self.store.multi_get([f"{name}/{r}/{n}" for r in peers])
        except Exception as err:  # the store's timeout (worker.nccl_timeout): a peer never got here
            raise CollectiveMismatch(self._message(pg, n, {me: call}, f"; ranks {peers} did not reach it ({err})"))
        calls = {me: call, **{r: value.decode() for r, value in zip(peers, seen)}}
        if len(set(calls.values())) > 1:
            raise CollectiveMismatch(self._message(pg, n, calls))

    def _message(self, pg: Any, n: int, calls: dict[int, str], tail: str = "") -> str:
        ranks = dist.get_process_group_ranks(pg)
        each = "; ".join(f"rank {ranks[r]}: {call}" for r, call in sorted(calls.items()))
        return (f"Collective #{n} on process group {pg.group_desc!r} (ranks {ranks}) during {self.method} differs "
                f"between ranks (NCCL/HCCL would hang here): {each}{tail}. Every rank must issue the same collectives "
                "in the same order (collective contract, docs/environment.md).")

    def wrap(self, module: Any, op: str, funcol_op: bool) -> None:
        original = getattr(module, op, None)
        if original is None or getattr(original, "_easyrl_contract", False):  # absent on this torch line (2.11 lacks
            return  # c10d's all_gather_single / reduce_scatter_single), or wrapped already
        parameters = inspect.signature(original).parameters
        label = f"funcol.{op}" if funcol_op else op

        def checked(*args: Any, **kwargs: Any) -> Any:
            if getattr(self.local, "depth", 0) == 0:
                bound = dict(zip(parameters, args), **kwargs)
                pg = (dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(bound["group"]))
                      if funcol_op else bound.get("group") or dist.group.WORLD)
                self.check(pg, _describe(label, pg, bound))
            self.local.depth = getattr(self.local, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                self.local.depth -= 1

        checked._easyrl_contract = True  # type: ignore[attr-defined]
        checked.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, op, checked)


def _describe(op: str, pg: Any, bound: dict[str, Any]) -> str:
    """``op(dtype[shape] device, ...)`` of one call; raises :class:`CollectiveMismatch` for a tensor on a device the
    group's backend does not serve (a host tensor on an NCCL/HCCL group)."""
    if op in OBJECT_OPS:
        return f"{op}()"
    tensors = [t for t in tree_leaves(list(bound.values())) if isinstance(t, torch.Tensor)]
    served = {device.type for device in pg._device_types}
    for t in tensors:
        if served and t.device.type not in served:
            raise CollectiveMismatch(f"{op} on process group {pg.group_desc!r} got a {t.device.type} tensor "
                                     f"{t.dtype}{list(t.shape)}, but its backend serves {sorted(served)} only; "
                                     "move the tensor to the device first (NCCL/HCCL take device tensors).")
    if op in UNEVEN:
        tensors = tensors[:1]
        return op + "(" + ", ".join(f"{t.dtype} {t.device.type}" for t in tensors) + ")"
    return op + "(" + ", ".join(f"{t.dtype}{list(t.shape)} {t.device.type}" for t in tensors) + ")"


_CONTRACT: Optional[_Contract] = None


def install() -> None:
    """Check every collective of this process from now on (after ``init_process_group``); idempotent."""
    global _CONTRACT
    if _CONTRACT is None:
        _CONTRACT = _Contract()
    for op in C10D_OPS:
        _CONTRACT.wrap(dist, op, funcol_op=False)
    for op in FUNCOL_OPS:
        _CONTRACT.wrap(funcol, op, funcol_op=True)


def method_end(method: str, raised: bool = False) -> None:
    """Post the end of worker method ``method`` as a call on every group this rank belongs to and compare it with the
    peers' (a rank with one collective more than its peers is caught here); ``raised``: the method raised, post
    without waiting. No-op unless :func:`install` ran."""
    if _CONTRACT is None:
        return
    for pg in list(dist.distributed_c10d._world.pg_map):
        _CONTRACT.check(pg, f"{'raised in' if raised else 'end of'} {method}", raised=raised)


def checked_call(worker: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``getattr(worker, method)(*args, **kwargs)`` (named in the messages) followed by :func:`method_end`."""
    if _CONTRACT is not None:
        _CONTRACT.method = method
    try:
        result = getattr(worker, method)(*args, **kwargs)
    except BaseException:
        method_end(method, raised=True)
        raise
    method_end(method)
    return result
