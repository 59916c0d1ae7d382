"""The workers as plain Ray actors, one per device rank, placed by one placement group (one bundle per rank).

The trainer calls ``run_all`` (same arguments), ``run_split`` (an equal share of a batch each) or ``run_rollout`` (an
equal share per vLLM engine), naming the method by reference (``run_split(FSDPWorker.compute_log_probs, batch)``);
results come back in rank (or engine) order. Each raises ``TypeError`` for a method named by a string and
``WorkerError`` when a worker died or raised (:func:`gather`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from easyrl import envvars
from easyrl.batch import Batch
from easyrl.config import PPOConfig
from easyrl.device import ray_actor_resources
from easyrl.quiet import worker_env
from easyrl.workers.collectives import ENV, contract_on
from easyrl.workers.fsdp_worker import FSDPWorker, Parts
from easyrl.workers.rollout_layout import RolloutLayout
from easyrl.workers.vllm_compat import IN_PROCESS_ENGINE_ENV


def worker_cpu_threads(device: str, offload: bool, cpus_per_node: int, workers_per_node: int,
                       cpu_threads_per_worker: int = 1) -> int:
    """Host CPU threads (and Ray CPUs) of one worker process: on the CPU ``cpu_threads_per_worker``; on GPU/NPU with
    a trained role's parameters offloaded (Adam steps on the host) ``(cpus_per_node - 1) // workers_per_node``;
    else 1."""
    if device == "cpu":
        return max(1, cpu_threads_per_worker)
    if not offload:
        return 1
    return max(1, (cpus_per_node - 1) // max(1, workers_per_node))


def _actor_resources(device: str, cpu_threads: int) -> dict:
    # cpu_threads (worker_cpu_threads): Ray reserves them and sets OMP_NUM_THREADS to match
    return {**ray_actor_resources(device), "num_cpus": cpu_threads}


def _bundle(device: str, cpu_threads: int) -> dict[str, float]:
    res = _actor_resources(device, cpu_threads)
    return {"CPU": float(res["num_cpus"]), **({"GPU": float(res["num_gpus"])} if "num_gpus" in res else {}),
            **{k: float(v) for k, v in res.get("resources", {}).items()}}


def node_contiguous_bundles(bundle_nodes: dict[int, str]) -> list[int]:
    """Bundle index for each rank so that every node's ranks are consecutive (a ``PACK`` group may order bundles
    across nodes in any order). ``bundle_nodes``: bundle index -> node id; nodes ordered by their first bundle."""
    first_bundle: dict[str, int] = {}
    for index in sorted(bundle_nodes):
        first_bundle.setdefault(bundle_nodes[index], index)
    return sorted(bundle_nodes, key=lambda index: (first_bundle[bundle_nodes[index]], index))


def worker_runtime_env(device: str, cpu_threads: int, user: dict[str, str]) -> dict[str, str]:
    """The environment variables of each worker process (Ray ``runtime_env.env_vars``): easyrl's (in-process vLLM,
    quiet logs, the thread count of :func:`worker_cpu_threads`, on CUDA vLLM's IPC all-reduces off, on NPUs
    vllm-ascend's NZ weight mode off), then ``worker.env_vars`` (``user``), which win."""
    env = {**IN_PROCESS_ENGINE_ENV, "TOKENIZERS_PARALLELISM": "false",
           **worker_env()}  # vLLM at WARNING, no worker progress bars (easyrl.quiet)
    env["OMP_NUM_THREADS"] = str(cpu_threads)
    if device == "cpu":
        # each worker's vLLM CPU engine uses its own threads (trainer.cpu_threads_per_worker), not all cores
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if device == "cuda":
        # these all-reduces map peer GPUs' memory, which a one-GPU Ray actor may fail to do: hang (use NCCL)
        env.update(VLLM_ALLREDUCE_USE_SYMM_MEM="0", VLLM_ALLREDUCE_USE_FLASHINFER="0")
    if device == "npu":
        # vllm-ascend refuses wake_up (and the ND-layout sync) in its default FRACTAL_NZ weight mode
        env["VLLM_ASCEND_ENABLE_NZ"] = "0"
    if envvars.check_collectives(os.environ):  # the contract (easyrl.workers.collectives) on in the driver's process
        env[ENV] = "1"
    env.update({str(k): str(v) for k, v in user.items()})
    return env


class WorkerError(RuntimeError):
    """A worker died (``died``) or raised during ``method``; ``rank`` names it. The other workers may be blocked in a
    collective with it: the group is unusable and must be shut down."""

    def __init__(self, rank: int, method: str, cause: BaseException, died: bool):
        what = "died" if died else "failed"
        super().__init__(f"worker rank {rank} {what} during {method}: {type(cause).__name__}: {cause}")
        self.rank, self.method, self.died = rank, method, died


def gather(refs: list[Any], method: str = "call") -> list[Any]:
    """``ray.get`` of one call per rank (``refs``, rank order) failing as soon as ANY rank fails (a plain ``ray.get``
    would wait on rank 0, blocked in a collective with the dead rank). Raises ``WorkerError`` naming that rank."""
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            try:
                results[rank_of[ref]] = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                raise WorkerError(rank_of[ref], method, err, died=True) from err
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
                raise WorkerError(rank_of[ref], method, cause, died=False) from err
    return results


def method_name(method: Callable[..., Any]) -> str:
    """The name under which a Ray actor handle exposes ``method``; raises ``TypeError`` for a string or a
    non-function."""
    if isinstance(method, str):
        raise TypeError(f"name the worker method itself (e.g. FSDPWorker.{method}), not the string {method!r}")
    name = getattr(method, "__name__", None)
    if not callable(method) or name is None:
        raise TypeError(f"expected a worker method such as FSDPWorker.save_checkpoint, got {method!r}")
    return name


def data_layout(world_size: int, ulysses_size: int, models: bool) -> RolloutLayout:
    """The shares of ``WorkerGroup.run_split`` over ``world_size`` ranks: a sequence-parallel group (``ulysses_size``
    consecutive ranks) shares one data-parallel share, laid out as TP is; a group without the model roles
    (``models`` False: the split rollout engines, ``Parts``) has no sequence-parallel groups, one share per rank.

    Raises:
        ConfigError: ``models`` and ``ulysses_size`` does not divide ``world_size``."""
    return RolloutLayout(world_size, ulysses_size if models else 1)


class WorkerGroup:
    """Starts ``world_size`` worker actors (``worker_cls``; default ``config.world_size``), each holding ``parts``,
    joins them in a process group and builds their models. A split placement's rollout engines are a second group
    (``Parts(models=False)``) placed ``beside`` these and one of their ``peers``. ``startup_seconds``: ``workers``, ``process_group`` and the slowest rank's phases.
    Raises ``RuntimeError`` when the cluster has fewer devices than ``world_size + beside``."""

    def __init__(self, config: PPOConfig, device: str, worker_cls: type = FSDPWorker, training_steps: int = 0,
                 world_size: Optional[int] = None, beside: int = 0, parts: Parts = Parts()):
        began = time.time()
        self.check_collectives = contract_on(config.trainer.check_collectives)
        world_size = world_size or config.world_size  # another size: the split rollout engines
        self.peers: list[WorkerGroup] = []  # groups shut down with this one (the split rollout engines)
        available = ray.cluster_resources()
        # a trained role's offloaded parameters mean a CPU Adam step (the frozen reference has no optimizer)
        offload = config.worker.actor.offload.offload_params or config.worker.critic.offload.offload_params
        per_node = config.trainer.n_gpus_per_node + (config.worker.rollout.n_gpus_per_node or 0)  # both groups
        threads = worker_cpu_threads(device, offload, int(available.get("CPU", 1) // max(1, config.trainer.nnodes)),
                                     per_node, config.trainer.cpu_threads_per_worker)
        bundle = _bundle(device, threads)
        placed = world_size + beside  # ``beside``: another group's workers, placed first
        for key, need in bundle.items():
            if available.get(key, 0) < need * placed:
                raise RuntimeError(
                    f"{placed} workers need {need * placed:g} {key} but the Ray cluster has "
                    f"{available.get(key, 0):g}; lower trainer.n_gpus_per_node / trainer.nnodes"
                    f"{' / worker.rollout.n_gpus_per_node' if beside else ''}"
                    f"{' / trainer.cpu_threads_per_worker' if device == 'cpu' else ''} or add nodes."
                )
        self.placement_group = placement_group([bundle] * world_size, strategy="PACK")
        ray.get(self.placement_group.ready())
        bundles = node_contiguous_bundles(placement_group_table(self.placement_group)["bundles_to_node_id"])
        remote_cls = ray.remote(worker_cls)
        res = _actor_resources(device, threads)
        self.workers = [
            remote_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=bundles[rank]),
                runtime_env={"env_vars": worker_runtime_env(device, threads, dict(config.worker.env_vars))},
                **res,
            ).remote(config, rank, world_size, device, training_steps, parts)
            for rank in range(world_size)
        ]
        master_addr, master_port = self.run_all(FSDPWorker.address)[0]
        self.startup_seconds = {"workers": time.time() - began}
        began = time.time()
        self.rollout_layout = RolloutLayout(world_size, config.worker.rollout.tensor_parallel_size)
        self.data_layout = data_layout(world_size, config.worker.actor.ulysses_size, parts.models)
        self.run_all(FSDPWorker.fetch_model_files)  # a hub id downloaded per node, before any collective timeout
        self.run_all(FSDPWorker.init_process_group, master_addr, master_port)
        self.startup_seconds["process_group"] = time.time() - began
        for seconds in self.run_all(FSDPWorker.init_models):  # the slowest rank's phases
            for phase, value in seconds.items():
                self.startup_seconds[phase] = max(value, self.startup_seconds.get(phase, 0.0))

    def _call(self, worker: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """One remote call of method ``name``; through ``FSDPWorker.checked`` under the collective contract."""
        if self.check_collectives:
            return worker.checked.remote(name, *args, **kwargs)
        return getattr(worker, name).remote(*args, **kwargs)

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def run_all(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with the same arguments; results in rank order."""
        return gather(self.submit_all(method, *args, **kwargs), method_name(method))

    def submit_all(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """:meth:`run_all` without waiting: one Ray reference per rank (``gather`` them), so that two groups' calls
        can run together."""
        name = method_name(method)
        return [self._call(w, name, *args, **kwargs) for w in self.workers]

    def run_split(self, method: Callable[..., Any], batch: Batch, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with its data-parallel group's equal consecutive share of ``batch`` (every
        rank of a sequence-parallel group gets the same share); results once per group, in order (``dp_size``)."""
        return self._run_grouped(method, batch, self.data_layout, **kwargs)

    @property
    def dp_size(self) -> int:
        """Data-parallel groups (``world_size / worker.actor.ulysses_size``): the shares of ``run_split``."""
        return self.data_layout.dp_size

    @property
    def rollout_dp_size(self) -> int:
        """Number of vLLM engines (``world_size / worker.rollout.tensor_parallel_size``)."""
        return self.rollout_layout.dp_size

    def run_rollout(self, method: Callable[..., Any], batch: Batch, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every worker with its engine's equal consecutive share of ``batch`` (the ranks of a
        tensor-parallel engine get the same share); results once per engine, in order, lining up with ``batch``."""
        return self._run_grouped(method, batch, self.rollout_layout, **kwargs)

    def submit_engine(self, engine: int, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank of vLLM engine ``engine`` (its tensor-parallel group) with the same arguments,
        without waiting: one Ray reference per rank, the engine's first rank first. Not through the collective
        contract, whose end-of-method check waits for every rank of the world: an engine's call runs on its own
        ranks only (vLLM's collectives within it are still checked, on the engine's own groups)."""
        name = method_name(method)
        return [getattr(self.workers[rank], name).remote(*args, **kwargs)
                for rank in self.rollout_layout.groups()[engine]]

    def _run_grouped(self, method: Callable[..., Any], batch: Batch, layout: RolloutLayout, **kwargs: Any) -> list[Any]:
        name = method_name(method)
        shares = batch.chunk(layout.dp_size)
        if layout.tensor_parallel_size > 1:  # one copy in Ray's object store for the ranks of a group
            shares = [ray.put(share) for share in shares]
        refs = [self._call(w, name, share, **kwargs) for w, share in zip(self.workers, layout.dispatch(shares))]
        return layout.collect(gather(refs, name))

    def shutdown(self, close_timeout_s: float = 30.0) -> None:
        """Let the workers release their shared memory (``FSDPWorker.close``, at most ``close_timeout_s`` seconds),
        then kill them and release their placement group; then the same for each of the ``peers``."""
        ray.wait([w.close.remote() for w in self.workers], num_returns=len(self.workers), timeout=close_timeout_s)
        for w in self.workers:
            ray.kill(w)
        ray.util.remove_placement_group(self.placement_group)
        for peer in self.peers:
            peer.shutdown(close_timeout_s)
