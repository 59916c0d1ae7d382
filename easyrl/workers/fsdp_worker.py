"""One worker per device rank (a Ray actor): what its group holds (``Parts``): the FSDP2 model roles
(``easyrl.workers.roles``) and/or a vLLM engine (``easyrl.workers.rollout``), fed the actor's weights in place when both
share the rank (``easyrl.workers.weight_sync``), else over the transfer group from the trainer's ranks
(``easyrl.workers.weight_transfer``). The trainer calls it through ``easyrl.workers.group.WorkerGroup``; test-only
methods are in ``easyrl.testing.worker``.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from easyrl import envvars
from easyrl.batch import Batch
from easyrl.config import PPOConfig
from easyrl.config.actor import teachers_of
from easyrl.device import collective_backend, device_name, empty_cache, memory_metrics, set_device, torch_device
from easyrl.models.hub_snapshot import local_model_path
from easyrl.quiet import quiet_libraries
from easyrl.workers import collectives, vllm_compat, weight_sync, weight_transfer
from easyrl.workers.fsdp_model import TORCH_DTYPES, gather_full_state_dict
from easyrl.workers.mm_staging import MultiModalStage
from easyrl.workers.roles import build_roles, timed
from easyrl.workers.rollout_layout import RolloutLayout
from easyrl.workers.vllm_cpu_fixes import remove_stale_tp_shm


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Parts:
    """What every worker of a group holds: ``models``: the FSDP2 model roles, whose passes it runs
    (``WorkerGroup.run_split``, sequence-parallel groups of ``ulysses_size``); ``engine``: a vLLM engine. Both: the
    colocated placement (the engine sleeps while the models train, its weights synced in place); one of them: a side
    of the split placement (the engine keeps its device and receives its weights, ``receive_weights``).
    ``engine_reads_checkpoint``: the engine loads the model folder's weights itself and keeps them (``easyrl eval``'s
    engines, which nothing sends weights to); else it starts from dummy weights where ``dummy_load`` allows."""

    models: bool = True
    engine: bool = True
    engine_reads_checkpoint: bool = False


class FSDPWorker:
    """The ``parts`` of one rank: the model roles (actor, reference, critic, teacher, reward model) and/or the rollout
    engine; ``training_steps`` is the length of the trained roles' LR schedule."""

    def __init__(self, config: PPOConfig, rank: int, world_size: int, device: str, training_steps: int = 0,
                 parts: Parts = Parts()):
        import psutil

        # start-up profile (easyrl.trainer.launch.StartupProfile): process start to here is spawn and imports
        self.startup_seconds = {"imports": time.time() - psutil.Process().create_time()}
        # vLLM must run in this process so weights can be handed over as tensors; set before vLLM is imported.
        os.environ.update(vllm_compat.IN_PROCESS_ENGINE_ENV)
        quiet_libraries()  # library messages that do not matter to a user (easyrl.quiet; EASYRL_VERBOSE=1: all)
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.training_steps = training_steps
        self.parts = parts
        self.actor = self.ref = self.critic = self.reward_model = None
        self.teachers: list = []  # the distillation teachers (FSDPPolicy each, easyrl.workers.roles)
        self.rollout = None
        self.transfer = None  # split placement: the group to the rollout engines (easyrl.workers.weight_transfer)
        self.judge_engine = None  # the LLM judge's vLLM engine (easyrl.workers.judge.VLLMJudge), built by judge()
        self.rollout_layout: Optional[RolloutLayout] = None  # the vLLM engines over the ranks, set by init_models
        self.weights_dirty = True
        self.mm_stage = MultiModalStage()  # this step's share's images, staged once (easyrl.workers.mm_staging)

    def address(self) -> tuple[str, int]:
        """This node's IP as Ray knows it (not ``gethostbyname``: often 127.0.1.1) and a free port (rank 0's is the
        process group's rendezvous)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def fetch_model_files(self) -> None:
        """Point the model paths at local folders, downloading hub ids into this node's cache; called before the
        process group exists, so a download waits under no collective timeout."""
        worker = self.config.worker
        reward_model = [worker.reward.reward_model] if worker.reward.reward_model.enabled else []
        teachers = [teacher.model for teacher in teachers_of(worker)]
        for model in (worker.actor.model, worker.critic.model, *teachers, *reward_model):
            model.model_path = local_model_path(model.model_path)
            model.tokenizer_path = local_model_path(model.tokenizer_path)

    def init_process_group(self, master_addr: str, master_port: int) -> None:
        """Join the workers' torch.distributed group (gloo / NCCL / HCCL) at rank 0's address."""
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        # the host threads WorkerGroup gave this worker (group.worker_cpu_threads): no oversubscribed intra-op pool
        torch.set_num_threads(envvars.omp_threads(os.environ) or 1)
        set_device(self.device)
        self.torch_device = torch_device(self.device)
        dist.init_process_group(backend=collective_backend(self.device), rank=self.rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=self.config.worker.nccl_timeout))
        if collectives.contract_on(self.config.trainer.check_collectives):
            collectives.install()  # every collective compared across the ranks, call by call

    def checked(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` under the collective contract: ``WorkerGroup`` calls every method through here when the contract
        is on, so that each method's end is compared across the ranks (``easyrl.workers.collectives.checked_call``)."""
        return collectives.checked_call(self, method, *args, **kwargs)

    def init_models(self) -> dict[str, float]:
        """Build the model roles (``build_roles``) and the vLLM engine, as ``parts`` says, each after its memory
        pre-flight. Returns the seconds of each start-up phase (``imports``, one per role, ``vllm_import``,
        ``engine``)."""
        if self.device != "cpu":
            self.check_memory("trainer" if self.parts.models else "rollout")
        if self.parts.models:
            self._init_roles()
        if self.parts.engine:
            self.init_engine()
        return self.startup_seconds

    def _init_roles(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from easyrl.models.ulysses import init_sequence_parallel

        cfg = self.config.worker
        mesh = init_device_mesh(self.device, (self.world_size,), mesh_dim_names=("dp",))
        init_sequence_parallel(cfg.actor.ulysses_size)  # the roles split packed rows over these groups
        roles = build_roles(self.config, mesh, self.device, self.torch_device, self.training_steps,
                            seconds=self.startup_seconds)
        self.actor, self.ref, self.critic, self.reward_model, self.teachers = (
            roles.actor, roles.ref, roles.critic, roles.reward_model, roles.teachers)

    def init_engine(self) -> None:
        """Build this rank's vLLM engine (``VLLMRollout``), timing ``vllm_import`` and ``engine``."""
        from easyrl.workers.rollout import VLLMRollout

        cfg = self.config.worker
        self.rollout_layout = RolloutLayout(self.world_size, cfg.rollout.tensor_parallel_size)
        remove_stale_tp_shm(self.device, self.rollout_layout, self.rank)  # an earlier run's (vLLM-CPU only)
        # one seed per engine: the ranks of a tensor-parallel engine must sample alike
        seed = cfg.rollout.seed + self.rollout_layout.dp_rank(self.rank)
        with timed(self.startup_seconds, "vllm_import"):  # apart from the engine
            import vllm  # noqa: F401
        with timed(self.startup_seconds, "engine"):
            self.rollout = VLLMRollout(cfg.actor.model.model_path, cfg.rollout, self.device, seed=seed,
                                       read_checkpoint=self.parts.engine_reads_checkpoint,
                                       record_routing=cfg.actor.router_replay.replays_rollout)
        empty_cache(self.device)

    def close(self) -> None:
        """Release vLLM's TP shared-memory segments in ``/dev/shm``, which outlive a killed process (every rank,
        at the end of a run: ``WorkerGroup.shutdown``)."""
        if self.rollout is None:
            return
        import gc

        self.rollout = None
        gc.collect()
        from vllm.distributed.parallel_state import destroy_model_parallel

        destroy_model_parallel()  # drops the TP group's broadcast ring: its owner unlinks the segment
        remove_stale_tp_shm(self.device, self.rollout_layout, self.rank)  # vLLM-CPU's all-reduce segments

    def check_memory(self, side: str = "trainer") -> None:
        """Pre-flight memory estimate of this worker's ``side`` before anything is loaded; raises ``ConfigError``
        when the run cannot fit (with the numbers and the setting to change)."""
        from easyrl.device import device_memory_gib
        from easyrl.sizing.estimate import preflight

        preflight(self.config, device_memory_gib(self.device), side, log=self.rank == 0)

    def _lora_scale(self) -> Optional[float]:
        """``alpha / rank`` of the actor's LoRA adapter, None without one."""
        from easyrl.models.lora import lora_scale

        return lora_scale(self.config.worker.actor.model.lora) if self.config.uses_lora else None

    def _ensure_rollout_weights(self) -> float:
        """Sync the actor's weights into vLLM if they changed or the engine dropped them (level-2 sleep); returns the
        seconds spent. Every rank decides alike, so the collective gathers stay in step. An engine without the
        actor beside it receives its weights (0 s here).

        Raises:
            RuntimeError: an engine without the actor that has not received the trainer's weights yet (it holds its
                start-up dummy weights)."""
        if not self.parts.models:
            if not self.rollout.holds_weights:
                raise RuntimeError("the rollout engine has not received the trainer's weights yet (receive_weights)")
            return 0.0
        if self.weights_dirty or not self.rollout.holds_weights:
            return self.sync_weights()
        return 0.0

    def sync_weights(self) -> float:
        """Load the actor's weights into vLLM in place and wake the KV cache; returns the seconds taken. Raises
        ``RuntimeError`` naming a vLLM parameter that was not overwritten."""
        rollout = self.config.worker.rollout
        start = time.perf_counter()
        weight_sync.sync_weights(self.actor.model.state_dict(), self.rollout, self.device, self.torch_device,
                                 TORCH_DTYPES[rollout.dtype], rollout.update_weights_bucket_megabytes * 2**20,
                                 lora_scale=self._lora_scale())
        self.rollout.wake_up(tags=["kv_cache"])
        self.weights_dirty = False
        return time.perf_counter() - start

    def transfer_plan(self) -> "weight_transfer.Plan":
        """The buckets in which :meth:`send_weights` sends the actor's weights (``weight_transfer.make_plan``; with
        LoRA the merged model's names and shapes)."""
        rollout = self.config.worker.rollout
        return weight_transfer.make_plan(self.actor.model.state_dict(), TORCH_DTYPES[rollout.dtype],
                                         rollout.update_weights_bucket_megabytes * 2**20,
                                         lora_scale=self._lora_scale())

    def join_transfer(self, address: str, port: int, size: int) -> None:
        """Join the transfer group between the trainer's ranks and the rollout engines (``weight_transfer.open_group``
        at rank 0's ``address``:``port``, ``size`` ranks): the trainer's rank 0 as its rank 0 (the other trainer ranks
        only gather), engine rank ``r`` as its rank ``1 + r``."""
        if self.parts.models and self.rank:
            self.transfer = None
            return
        self.transfer = weight_transfer.open_group(address, port, 0 if self.parts.models else 1 + self.rank, size,
                                                   self.device, self.config.worker.nccl_timeout)

    def send_weights(self, plan: "weight_transfer.Plan") -> float:
        """Send the actor's weights to the rollout engines (``weight_transfer.send``; every rank gathers, rank 0
        sends; with LoRA the merged ``W + scale * B @ A``) while they receive them (:meth:`receive_weights`);
        returns the seconds taken."""
        start = time.perf_counter()
        weight_transfer.send(self.transfer, self.actor.model.state_dict(), plan, self.torch_device,
                             TORCH_DTYPES[self.config.worker.rollout.dtype], lora_scale=self._lora_scale())
        empty_cache(self.device)
        return time.perf_counter() - start

    def receive_weights(self, plan: "weight_transfer.Plan", version: int) -> float:
        """Load the trainer's weights (sent by :meth:`send_weights` along ``plan``) into this engine in place, its
        requests in flight kept (their later tokens are of ``version``: a partial rollout, ``RequestEngine.reload``);
        returns the seconds taken.

        Raises:
            RuntimeError: a vLLM parameter was not written (``weight_sync.check_all_loaded`` names it)."""
        start = time.perf_counter()
        self.rollout.wake_up()
        dtype = TORCH_DTYPES[self.config.worker.rollout.dtype]
        expected, loaded = self.rollout.load_weights(weight_transfer.receive(self.transfer, plan, self.torch_device,
                                                                             dtype), version=version)
        weight_sync.check_all_loaded(set(expected), set(loaded))
        return time.perf_counter() - start

    def generate_sequences(self, prompts: Batch, overrides: Optional[dict[str, Any]] = None,
                           keep_awake: bool = False) -> dict[str, Any]:
        """Sample one response per prompt (already repeated ``n`` times); a per-sample ``max_tokens`` caps each
        response (a multi-turn rollout's remaining budget). ``keep_awake``: the engine stays awake with its weights
        for the next turn until ``sleep_rollout``. Returns ``{"response_ids": list[list[int]],
        "response_log_probs": list[list[float]] | None, "routed_experts": per sample ``(positions, layers, top_k)``
        or None (``VLLMRollout.generate``), "timing_s/reshard": seconds spent syncing weights, "busy",
        "offered": the engine's decode slots held and offered over its steps}``."""
        self.mm_stage.count(prompts)  # processor outputs sent along, if any (the trainer sends none: vLLM takes images)
        reshard = self._ensure_rollout_weights()
        self.rollout.wake_up()
        seeds = prompts["rollout_seed"] if "rollout_seed" in prompts else None
        videos = prompts["videos"] if "videos" in prompts else None
        max_tokens = prompts["max_tokens"] if "max_tokens" in prompts else None
        engine = self.rollout.engine
        busy, offered = engine.busy_steps, engine.slot_steps
        response_ids, response_log_probs, routed_experts = self.rollout.generate(
            prompts["raw_prompt_ids"], prompts["images"], overrides, seeds=seeds, max_tokens=max_tokens, videos=videos)
        if not keep_awake:
            self.sleep_rollout()
        return {"response_ids": response_ids, "response_log_probs": response_log_probs,
                "routed_experts": routed_experts, "timing_s/reshard": reshard,
                "busy": engine.busy_steps - busy, "offered": engine.slot_steps - offered}

    def advance(self, keys: list[Any], prompts: Optional[Batch], overrides: Optional[dict[str, Any]] = None,
                slots: int = 0, max_steps: int = 16) -> dict[str, Any]:
        """Drive the engine request by request (``easyrl.trainer.request_stream``): admit ``prompts`` (one sample
        per row, fields as ``generate_sequences``'; None: none) under ``keys``, then run engine steps until a request
        finishes or ``max_steps`` steps ran (every rank of a tensor-parallel engine makes the same calls, so all stop
        alike). Returns ``{"finished": [(key, token_ids, log_probs | None, versions, routed_experts | None)], "busy":
        ..., "offered": ...}``: the requests done (``Finished``'s fields), and the decode slots held and offered
        (``slots`` per step) over the steps run."""
        engine = self.rollout.engine
        if prompts is not None and len(keys):
            if not self.rollout.holds_weights or (self.actor is not None and self.weights_dirty):
                raise RuntimeError("the engine's weights are not the actor's: call wake_rollout on every rank before "
                                   "advance (the sync is a collective)")
            requests = self.rollout.requests(
                prompts["raw_prompt_ids"], prompts["images"], overrides,
                seeds=prompts["rollout_seed"] if "rollout_seed" in prompts else None,
                max_tokens=prompts["max_tokens"] if "max_tokens" in prompts else None,
                videos=prompts["videos"] if "videos" in prompts else None)
            for key, (prompt, params) in zip(keys, requests):
                engine.add(key, prompt, params)
        busy, offered, done = engine.busy_steps, engine.slot_steps, []
        for _ in range(max_steps):
            if not engine.in_flight or done:
                break
            done = engine.step(slots)
        return {"finished": [(s.key, s.token_ids, s.log_probs, s.versions, s.routed_experts) for s in done],
                "busy": engine.busy_steps - busy, "offered": engine.slot_steps - offered}

    def wake_rollout(self) -> float:
        """Bring the engine's weights up to date (a collective: every rank at once) and wake it, before ``advance``
        calls; returns the seconds spent syncing. ``sleep_rollout`` puts it back to sleep."""
        reshard = self._ensure_rollout_weights()
        self.rollout.wake_up()
        return reshard

    def abort_requests(self) -> int:
        """Drop every request in flight on the engine (a stopped stream); returns how many."""
        return self.rollout.engine.abort()

    def sleep_rollout(self) -> None:
        """Put the engine to sleep and free the cache (after ``generate_sequences(..., keep_awake=True)``); an engine
        without the models beside it keeps its device (no-op)."""
        if not self.parts.models:
            return
        self.rollout.sleep()
        empty_cache(self.device)

    def stage_multi_modal(self, share: Batch) -> None:
        """Keep this worker's share of the step's ``multi_modal_inputs`` for the step's passes, which then send
        references to them instead (``easyrl.workers.mm_staging``)."""
        self.mm_stage.stage(share)

    def release_multi_modal(self) -> int:
        """Drop the staged multi-modal inputs; returns the bytes of multi-modal inputs received since the last call."""
        return self.mm_stage.release()

    def compute_log_probs(self, data: Batch) -> torch.Tensor:
        """Old log-probs: the actor's, before this step's update, ``(bsz, resp_len)``."""
        data = self.mm_stage.attach(data)
        actor = self.config.worker.actor
        return self.actor.compute_log_probs(data, actor.micro_batch_size_per_device_for_experience, actor.temperature)

    def compute_log_probs_and_routing(self, data: Batch) -> dict[str, torch.Tensor]:
        """R2's old-log-prob pass: ``{"old_log_probs": (bsz, resp_len), "routed_experts": (bsz, P + R, layers,
        top_k) int16}``, the actor's log-probs and the experts its routers chose (``FSDPPolicy.
        compute_log_probs_and_routing``)."""
        data = self.mm_stage.attach(data)
        data = data.without("routed_experts")  # the actor's own routing is recorded, not a dumped run's replayed
        actor = self.config.worker.actor
        log_probs, routing = self.actor.compute_log_probs_and_routing(
            data, actor.micro_batch_size_per_device_for_experience, actor.temperature)
        return {"old_log_probs": log_probs, "routed_experts": routing}

    def compute_ref_log_probs(self, data: Batch) -> torch.Tensor:
        """Reference-policy log-probs, ``(bsz, resp_len)``: the reference model's, or with LoRA the actor's with its
        adapter switched off (the base weights)."""
        cfg = self.config.worker
        micro, temperature = cfg.ref.micro_batch_size_per_device_for_experience, cfg.actor.temperature
        data = self.mm_stage.attach(data)
        if self.config.uses_lora:
            from easyrl.models.lora import adapter_disabled

            data = data.without("routed_experts")  # the base weights route by themselves, as a reference would
            with adapter_disabled(self.actor.model):
                return self.actor.compute_log_probs(data, micro, temperature)
        return self.ref.compute_log_probs(data, micro, temperature)

    def update_actor(self, data: Batch) -> dict[str, Any]:
        """Policy update on this worker's share; marks the rollout weights stale. Returns metric name -> values;
        without ``old_log_probs`` in ``data`` (an on-policy step) also ``"old_log_probs"``: the update's own
        pre-step log-probs ``(bsz, resp_len)``."""
        cfg = self.config
        mini = cfg.mini_batch_samples("actor", len(data))
        data = self.mm_stage.attach(data)
        metrics: dict[str, Any] = self.actor.update_policy(
            data, mini, cfg.worker.actor.micro_batch_size_per_device_for_update, cfg.sync_check_threshold)
        if self.actor.on_policy_log_probs is not None:
            metrics["old_log_probs"] = self.actor.on_policy_log_probs
        self.weights_dirty = True
        empty_cache(self.device)
        metrics.update({key: [value] for key, value in memory_metrics(self.device).items()})
        return metrics

    def device_name(self) -> str:
        """The accelerator's name (for its peak FLOP/s), or ``cpu``."""
        return device_name(self.device)

    def compute_values(self, data: Batch) -> torch.Tensor:
        """The critic's values of the response positions, ``(bsz, resp_len)``."""
        data = self.mm_stage.attach(data)
        return self.critic.compute_values(data, self.config.worker.critic.micro_batch_size_per_device_for_experience)

    def update_critic(self, data: Batch) -> dict[str, list[float]]:
        """Value-loss update of the critic on this worker's share (needs ``values`` and ``returns``)."""
        cfg = self.config
        mini = cfg.mini_batch_samples("critic", len(data))
        data = self.mm_stage.attach(data)
        metrics = self.critic.update_critic(data, mini, cfg.worker.critic.micro_batch_size_per_device_for_update)
        empty_cache(self.device)
        return metrics

    def save_hf(self, path: str) -> Optional[str]:
        """Export the actor in Hugging Face format; with LoRA the merged model in ``path`` and the peft adapter in
        ``path/lora_adapter``. Collective (rank 0 writes); returns the folder on rank 0, None elsewhere."""
        from easyrl.models.hf_folder import write_hf_folder

        state = gather_full_state_dict(self.actor.model)
        if self.rank != 0:
            return None
        model_cfg = self.config.worker.actor.model
        sources = list(dict.fromkeys((model_cfg.model_path, model_cfg.tokenizer_path or model_cfg.model_path)))
        if not self.config.uses_lora:
            return write_hf_folder(state, sources, path, trust_remote_code=model_cfg.trust_remote_code)
        from easyrl.models.lora import excluded_modules, merge_lora_stream, save_adapter

        merged = dict(merge_lora_stream(state.items(), self._lora_scale()))
        write_hf_folder(merged, sources, path, trust_remote_code=model_cfg.trust_remote_code)
        save_adapter(state, model_cfg.lora, model_cfg.model_path, os.path.join(path, "lora_adapter"),
                     excluded_modules(model_cfg.lora, self.actor.model))
        return path

    def save_checkpoint(self, path: str) -> None:
        """Write this rank's part of a checkpoint (the actor and, with GAE, the critic) into ``path``; rank 0 also
        copies the base model's config and tokenizer files. Every rank must call it."""
        from easyrl.workers.checkpoint import CRITIC_DIR, save_hf_metadata, save_role

        model_only = self.config.trainer.save_model_only
        save_role(self.actor, path, self.rank, model_only=model_only)
        if self.critic is not None:
            save_role(self.critic, path, self.rank, CRITIC_DIR, model_only=model_only)
        if self.rank == 0:
            model_cfg = self.config.worker.actor.model
            save_hf_metadata(model_cfg.model_path, model_cfg.tokenizer_path or model_cfg.model_path, path,
                             lora=model_cfg.lora if self.config.uses_lora else None)

    def load_checkpoint(self, path: str) -> None:
        """Restore the actor (and the critic), optimizers, LR schedules, counters and this rank's RNG states from
        ``path``; the engine gets the weights before the next generation. Every rank must call it."""
        from easyrl.workers.checkpoint import CRITIC_DIR, load_role

        load_role(self.actor, path, self.rank)
        if self.critic is not None:
            load_role(self.critic, path, self.rank, CRITIC_DIR)
        self.weights_dirty = True

    def judge(self, share: Batch) -> list[Optional[str]]:
        """The judge's verdict texts of this worker's share of ``share["judge_prompt"]``, in order; None for a prompt
        too long for its context. The judge engine is built on the first call."""
        from easyrl.workers.judge import VLLMJudge

        cfg = self.config.worker
        if self.judge_engine is None:
            self.judge_engine = VLLMJudge(cfg.reward.judge, self.device, seed=cfg.rollout.seed,
                                          enforce_eager=cfg.rollout.enforce_eager)
        verdicts = self.judge_engine.judge(list(share["judge_prompt"]))
        empty_cache(self.device)
        return verdicts

    def compute_rm_scores(self, data: Batch) -> torch.Tensor:
        """The reward model's scores of this worker's share, ``(bsz,)`` float32, from the reward model's own
        ``input_ids`` / ``attention_mask`` (``easyrl.rewards.reward_model_inputs``)."""
        scores = self.reward_model.compute_scores(data)
        empty_cache(self.device)
        return scores

    def compute_teacher_log_probs(self, data: Batch) -> torch.Tensor:
        """Each sample's distillation teacher's log-probs of its sampled response tokens, ``(bsz, resp_len)``, at the
        rollout temperature (as the student's old log-probs; ``easyrl.algorithms.distillation``). With several
        teachers ``data["teacher_index"]`` ``(bsz,)`` names each sample's (``easyrl.config.actor.route_teachers``):
        every rank runs every teacher, in order, on its rows of it only (none: filler forwards, as many as the
        rank with the most, ``FSDPTrainable._score_responses``)."""
        cfg = self.config.worker
        data = self.mm_stage.attach(data)
        out = torch.zeros(data["response_mask"].shape, dtype=torch.float32)
        for index, teacher in enumerate(self.teachers):
            rows = None if len(self.teachers) == 1 else (data["teacher_index"] == index).nonzero().flatten().tolist()
            out += teacher.compute_log_probs(data, cfg.teacher.micro_batch_size_per_device_for_experience,
                                             cfg.actor.temperature, rows=rows)
        return out
