"""The workers as plain Ray actors, one per device rank, placed by one placement group (one bundle per rank).

No dispatch decorators: the trainer asks for ``run_all`` (same arguments everywhere) or ``run_split`` (an equal share of
a batch each) and gets the per-worker results back in rank order.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from easyrl.batch import Batch
from easyrl.config import PPOConfig
from easyrl.device import ray_actor_resources
from easyrl.workers.fsdp_worker import FSDPWorker


def _actor_resources(device: str, cpu_threads: int) -> dict:
    res = ray_actor_resources(device)
    if device == "cpu":
        res["num_cpus"] = cpu_threads  # a CPU worker's threads are its devices
    return res


def _bundle(device: str, cpu_threads: int) -> dict[str, float]:
    res = _actor_resources(device, cpu_threads)
    bundle = {"CPU": float(res.get("num_cpus", 1))}
    if "num_gpus" in res:
        bundle["GPU"] = float(res["num_gpus"])
    bundle.update({k: float(v) for k, v in res.get("resources", {}).items()})
    return bundle


def node_contiguous_bundles(bundle_nodes: dict[int, str]) -> list[int]:
    """Bundle index for each rank, so that every node's ranks are consecutive.

    A ``PACK`` placement group may spread its bundles over nodes in any order; ranks in bundle order would then
    interleave nodes, and rank-adjacent collectives (and anything that assumes ``rank // n_gpus_per_node`` is the
    node) would cross the network. Nodes are ordered by their first bundle (so bundle 0's node holds rank 0), bundles
    within a node by index.

    Args:
        bundle_nodes: bundle index -> node id (``placement_group_table(pg)["bundles_to_node_id"]``).

    Returns:
        ``order`` with ``order[rank]`` = the bundle index that rank is placed on.
    """
    first_bundle: dict[str, int] = {}
    for index in sorted(bundle_nodes):
        first_bundle.setdefault(bundle_nodes[index], index)
    return sorted(bundle_nodes, key=lambda index: (first_bundle[bundle_nodes[index]], index))


def _worker_env(device: str, cpu_threads: int) -> dict[str, str]:
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
           # vLLM's per-engine INFO lines would drown the step metrics; set VLLM_LOGGING_LEVEL=INFO to see them
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    if device == "cpu":
        # each worker's vLLM CPU engine uses its own threads (trainer.cpu_threads_per_worker) instead of binding to
        # all cores; the worker sets torch's intra-op pool from OMP_NUM_THREADS
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    return env


class WorkerGroup:
    """Starts ``world_size`` ``FSDPWorker`` actors, joins them in a process group and builds their models.

    Raises:
        RuntimeError: the cluster has fewer devices than ``trainer.nnodes * trainer.n_gpus_per_node``.
    """

    def __init__(self, config: PPOConfig, device: str):
        world_size = config.world_size
        threads = config.trainer.cpu_threads_per_worker
        bundle = _bundle(device, threads)
        available = ray.cluster_resources()
        for key, need in bundle.items():
            if available.get(key, 0) < need * world_size:
                raise RuntimeError(
                    f"{world_size} workers need {need * world_size:g} {key} but the Ray cluster has "
                    f"{available.get(key, 0):g}; lower trainer.n_gpus_per_node / trainer.nnodes"
                    f"{' / trainer.cpu_threads_per_worker' if device == 'cpu' else ''} or add nodes."
                )
        self.placement_group = placement_group([bundle] * world_size, strategy="PACK")
        ray.get(self.placement_group.ready())
        bundles = node_contiguous_bundles(placement_group_table(self.placement_group)["bundles_to_node_id"])
        remote_cls = ray.remote(FSDPWorker)
        res = _actor_resources(device, threads)
        self.workers = [
            remote_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=bundles[rank]),
                runtime_env={"env_vars": _worker_env(device, threads)},
                **res,
            ).remote(config, rank, world_size, device)
            for rank in range(world_size)
        ]
        master_addr, master_port = ray.get(self.workers[0].address.remote())
        self.run_all("init_process_group", master_addr, master_port)
        self.run_all("init_models")

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with the same arguments; results in rank order."""
        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def run_split(self, method: str, batch: Batch, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with its equal consecutive share of ``batch``; results in rank order."""
        shares = batch.chunk(self.world_size)
        return ray.get([getattr(w, method).remote(share, **kwargs) for w, share in zip(self.workers, shares)])

    def shutdown(self) -> None:
        """Kill the workers and release their placement group."""
        for w in self.workers:
            ray.kill(w)
        ray.util.remove_placement_group(self.placement_group)
