"""The phases of one training step run with easyrl's own worker code as rank 0 of the config's world on simulated
devices, each recording the device's peak memory: load and shard, the experience forwards at the config's token budget
(reward model and each teacher too), the weight-sync gather, the checkpoint state dict, the export gather and the
updates; a VL model's budget batch holds one image per prompt (docs/simulate.md). Rank 0 reads the (faked) checkpoint
and holds the largest ``Shard(0)`` pieces."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Callable, Iterator, Optional
from unittest import mock

import torch
from torch.distributed.tensor import DTensor

from easyrl.config import PPOConfig
from easyrl.config.actor import teachers_of
from easyrl.errors import ModelError
from easyrl.simulate.attention import simulated_vl
from easyrl.simulate.fake_device import (
    GIB,
    DeviceSpec,
    accelerator_standins,
    device_check,
    fake_checkpoint_reader,
    fake_state,
    fake_tensors,
    fake_world,
    outside_fake_mode,
)
from easyrl.sizing.anatomy import VisionShape, meta_model, vision_shape
from easyrl.sizing.estimate import JUDGE
from easyrl.sizing.vision import prompt_image_grid

MODEL_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_configs")


@dataclass
class PhaseResult:
    """One phase: ``peak_gib`` of device memory while it ran, ``resident_gib`` after it, ``seconds`` on this CPU."""

    name: str
    peak_gib: float
    resident_gib: float
    seconds: float


@dataclass
class Simulation:
    """What one simulated rank measured."""

    phases: list[PhaseResult] = field(default_factory=list)
    beside: dict[str, float] = field(default_factory=dict)
    """GiB held beside every phase by what is not simulated but stays resident (the LLM judge's vLLM engine)."""


@contextlib.contextmanager
def simulated_rank(spec: DeviceSpec, world_size: int, kind: str) -> Iterator[tuple]:
    """Rank 0 of ``world_size`` on fake ``kind`` tensors for ``spec`` devices, with every stand-in; yields ``(1-D
    dp mesh, SimulatedDevice)``."""
    from torch.distributed.device_mesh import init_device_mesh

    import easyrl.workers.fsdp_model as fsdp_model
    from easyrl.models import lora

    # peft's Module.to refuses the weakref FakeTensorMode keeps on its tensors: FSDP2 makes the adapter fake later
    with fake_world(0, world_size, kind), accelerator_standins(spec), \
            mock.patch.object(fsdp_model, "read_checkpoint", fake_checkpoint_reader), \
            mock.patch.object(lora, "apply_lora", outside_fake_mode(lora.apply_lora)), simulated_vl():
        mesh = init_device_mesh(kind, (world_size,), mesh_dim_names=("dp",))
        with fake_tensors(kind) as mode:
            yield mesh, mode


def model_folder(model_path: str) -> str:
    """``model_path`` when it holds a ``config.json``, else the shipped ``easyrl/model_configs/<name>``;
    ``ModelError`` when neither exists."""
    if os.path.isfile(os.path.join(model_path, "config.json")):
        return model_path
    shipped = os.path.join(MODEL_CONFIGS, model_path.rstrip("/").split("/")[-1])
    if os.path.isfile(os.path.join(shipped, "config.json")):
        return shipped
    raise ModelError(f"worker.actor.model.model_path={model_path!r} has no config.json to simulate: give a folder "
                     f"holding one (no weights needed), or add {shipped}/config.json")


def budget_batch(config: PPOConfig, tokens: int, grid: Optional[ImageGrid] = None, length: int = 0):
    """Full-length host rows (prompt + response, or ``length`` tokens) filling ``tokens``, as the trainer sends them;
    with ``grid`` (a VL model) one image per prompt (:func:`add_images`)."""
    from tensordict import TensorDict

    from easyrl.batch import Batch

    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    length = length or prompt + response
    bsz = max(1, tokens // length)
    tensors = {"input_ids": torch.randint(0, 1000, (bsz, length)),
               "attention_mask": torch.ones(bsz, length, dtype=torch.long),
               "response_mask": torch.ones(bsz, response, dtype=torch.long),  # integers, as the trainer sends it
               # values, returns: the critic's
               **{key: torch.zeros(bsz, response) for key in ("advantages", "old_log_probs", "ref_log_probs",
                                                              "values", "returns")}}
    extras = {"multi_modal_inputs": add_images(tensors["input_ids"], prompt, grid)} if grid is not None else {}
    return Batch(TensorDict(tensors, batch_size=[bsz]), extras)


@dataclass(frozen=True)
class ImageGrid:
    """One image as the Qwen-VL processor cuts it: ``grid_thw`` ``(temporal, height, width)`` in patches (a row of
    ``image_grid_thw``), the tower's widths and the ids of the tokens around and in the image."""

    grid_thw: tuple[int, int, int]
    vision: VisionShape
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    @property
    def patches(self) -> int:
        """Rows of ``pixel_values`` for this image."""
        return math.prod(self.grid_thw)

    @property
    def tokens(self) -> int:
        """Image pad tokens in the prompt for this image (``merge_size^2`` patches each)."""
        return self.patches // self.vision.merge_size ** 2


def vision_grid(config: PPOConfig, model_path: str, trust_remote_code: bool = False) -> Optional[ImageGrid]:
    """The image each prompt of the budget batch holds for the model at ``model_path``, the largest ``config`` admits
    (``easyrl.sizing.vision.prompt_image_grid``); None for a text model or no room (a text-only batch)."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_folder(model_path), trust_remote_code=trust_remote_code)
    vision = vision_shape(hf_config)
    grid = prompt_image_grid(config, vision) if vision is not None else None
    if grid is None:
        return None
    text = getattr(hf_config, "text_config", None) or hf_config
    ids = [next(v for v in (getattr(hf_config, key, None), getattr(text, key, None)) if v is not None)
           for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id")]
    return ImageGrid(grid, vision, *map(int, ids))


def add_images(input_ids: torch.Tensor, prompt_length: int, grid: ImageGrid) -> list[dict[str, torch.Tensor]]:
    """Put one image's tokens (vision start, ``grid.tokens`` pads, vision end) in each prompt of ``input_ids``
    ``(bsz, prompt_length + response)``, in place; returns per sample ``pixel_values`` ``(grid.patches,
    patch_dim)`` float32 and ``image_grid_thw`` ``(1, 3)`` int64, host tensors."""
    start = (prompt_length - grid.tokens - 2) // 2  # text before and after the image
    input_ids[:, start] = grid.vision_start_token_id
    input_ids[:, start + 1:start + 1 + grid.tokens] = grid.image_token_id
    input_ids[:, start + 1 + grid.tokens] = grid.vision_end_token_id
    return [{"pixel_values": torch.zeros(grid.patches, grid.vision.patch_dim),
             "image_grid_thw": torch.tensor([grid.grid_thw])} for _ in range(input_ids.shape[0])]


def simulate(config: PPOConfig, spec: DeviceSpec, log: Callable[[str], None] = print,
             update: bool = True) -> Simulation:
    """Run the phases as rank 0 of ``config.world_size`` on fake ``spec`` devices (``update``: the updates too);
    ``DeviceCheckError`` when a host tensor reaches a device op or a collective."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from transformers import AutoModelForSequenceClassification

    import easyrl.workers.fsdp_model as fsdp_model
    from easyrl.workers.policy import FSDPPolicy
    from easyrl.workers.reward_model import FSDPRewardModel
    from easyrl.workers.roles import teacher_role_config
    from easyrl.workers.weight_sync import iter_full_weights

    cfg, rm = config.worker, config.worker.reward.reward_model
    kind = "cuda"  # Ascend is simulated on fake cuda tensors: torch_npu's device type needs its driver to register
    device = torch.device(kind, 0)
    sim = Simulation()
    path = model_folder(cfg.actor.model.model_path)
    micro = cfg.actor.micro_batch_size_per_device_for_experience
    grid = vision_grid(config, cfg.actor.model.model_path, cfg.actor.model.trust_remote_code)
    batch = budget_batch(config, config.token_budget(micro), grid)  # real host tensors, as the trainer sends them
    teacher_batch = budget_batch(config, config.token_budget(cfg.teacher.micro_batch_size_per_device_for_experience))
    rm_length = rm.max_length or config.data.max_prompt_length + config.data.max_response_length
    rm_batch = budget_batch(config, rm.micro_batch_size_per_device * rm_length, length=rm_length)
    if cfg.reward.judge.model_path is not None:  # its engine stays resident: no sleep mode (easyrl.workers.judge)
        sim.beside[JUDGE] = cfg.reward.judge.gpu_memory_utilization * spec.memory_gib
    with simulated_rank(spec, config.world_size, kind) as (mesh, mode):
        def phase(name: str, run: Callable[[], object]) -> object:
            start = time.perf_counter()
            mode.reset_peak()
            with device_check(name):
                result = run()
            sim.phases.append(PhaseResult(name, mode.peak / GIB, mode.allocated / GIB, time.perf_counter() - start))
            log(f"  {name}: peak {mode.peak / GIB:.1f} GiB ({time.perf_counter() - start:.0f} s)")
            return result

        actor = phase("load actor", lambda: FSDPPolicy(path, cfg.actor, mesh, kind, device, trainable=True,
                                                       offload=cfg.actor.offload))
        ref = phase("load reference", lambda: FSDPPolicy(path, cfg.actor, mesh, kind, device, trainable=False,
                                                         offload=cfg.ref.offload, init_from=actor)) \
            if config.builds_reference else None
        phase("old log-probs (forward)", lambda: actor.compute_log_probs(batch, micro, cfg.actor.temperature))
        if ref is not None:
            phase("reference forward", lambda: ref.compute_log_probs(batch, micro, cfg.actor.temperature))
        teachers = teachers_of(cfg) if config.algorithm.needs_teacher else []
        loaded_teachers = [phase(f"load {t.label}", lambda t=t: FSDPPolicy(  # all built at start-up, as the workers
            model_folder(t.model.model_path), teacher_role_config(config, t), mesh, kind, device, trainable=False,
            offload=t.offload)) for t in teachers]
        for t, teacher in zip(teachers, loaded_teachers):  # each at the full budget: an upper bound of its rows
            phase(f"{t.label} forward", lambda teacher=teacher: teacher.compute_log_probs(
                teacher_batch, cfg.teacher.micro_batch_size_per_device_for_experience, cfg.actor.temperature))
        if rm.enabled:
            def loaded(path, **kwargs):  # from_pretrained's model on rank 0: a fake state dict and buffers
                state, buffers = fake_state(meta_model(kwargs["config"], classifier=True))
                return SimpleNamespace(state_dict=lambda: state, named_buffers=lambda: iter(buffers.items()))

            rm_cfg = replace(rm, model_path=model_folder(rm.model_path))  # the folder holding its config.json
            with mock.patch.object(AutoModelForSequenceClassification, "from_pretrained", loaded):
                scorer = phase("load reward model", lambda: FSDPRewardModel(rm_cfg, mesh, kind, device, pad_id=0))
            phase("reward model forward", lambda: scorer.compute_scores(rm_batch))
        dtype = fsdp_model.TORCH_DTYPES[cfg.rollout.dtype]
        bucket = cfg.rollout.update_weights_bucket_megabytes * 2**20
        phase("weight sync gather", lambda: [None for _ in iter_full_weights(actor.model.state_dict(), device,
                                                                              dtype, bucket)])
        phase("checkpoint state dict", lambda: get_state_dict(actor.model, actor.optimizer))
        phase("export gather", lambda: fsdp_model.gather_full_state_dict(actor.model))
    if update:
        sim.phases.extend(simulate_updates(config, spec, log))
    return sim


def _state_bytes(policy) -> int:
    """Bytes of this rank's trainable parameter shards, their float32 gradient shards and AdamW states."""
    def nbytes(t, element_size=None):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * (element_size or t.element_size())

    params = [p for p in policy.model.parameters() if p.requires_grad]
    states = [v for state in policy.optimizer.state.values() for v in state.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0]
    return sum(nbytes(p) + nbytes(p, 4) for p in params) + sum(nbytes(v) for v in states)


UPDATES = {"actor": "update_policy", "critic": "update_critic"}  # the update method of each trained model


def update_batches(config: PPOConfig) -> dict[str, tuple]:
    """``{"actor": (micro, first, later), "critic": ...}`` (the critic with one): the micro-batch size of each trained
    model's update, and the host rows a first and a later optimizer step of one rank take, as the trainer sends them.
    A first step holds one micro-batch's token budget; a later one two when the rank's mini-batch
    (``PPOConfig.mini_batch_samples``, the worker's) holds more than one micro-batch, so that gradients accumulate."""
    cfg = config.worker
    roles = {"actor": cfg.actor} | ({"critic": cfg.critic} if config.algorithm.needs_critic else {})
    batches = {}
    for name, role in roles.items():
        micro = role.micro_batch_size_per_device_for_update
        path = role.model.model_path or cfg.actor.model.model_path  # the critic's null: the actor's checkpoint
        grid = vision_grid(config, path, role.model.trust_remote_code)
        batch = budget_batch(config, config.token_budget(micro, role), grid)
        batches[name] = (micro, batch, budget_batch(config, 2 * config.token_budget(micro, role), grid)
                         if config.mini_batch_samples(name) > micro else batch)
    return batches


def simulate_updates(config: PPOConfig, spec: DeviceSpec,
                     log: Callable[[str], None] = print) -> list[PhaseResult]:
    """The actor's update (and the critic's, with one) at the update token budget on fake CPU tensors (autograd
    cannot run backward on a fake ``cuda`` device): each peak is a second step's (AdamW states resident), over two
    micro-batches when the mini-batch holds more, offloaded shards taken out (docs/simulate.md)."""
    from easyrl.workers.critic import FSDPCritic
    from easyrl.workers.policy import FSDPPolicy

    cfg, cpu = config.worker, torch.device("cpu")
    batches = update_batches(config)  # real host tensors (made before the fake mode)
    results = []
    with simulated_rank(spec, config.world_size, "cpu") as (mesh, mode):
        start = time.perf_counter()
        models = {"actor": FSDPPolicy(model_folder(cfg.actor.model.model_path), cfg.actor, mesh, "cpu", cpu,
                                      trainable=True, offload=cfg.actor.offload)}
        if config.algorithm.needs_critic:
            models["critic"] = FSDPCritic(model_folder(cfg.critic.model.model_path), cfg.critic, mesh, "cpu", cpu)
        with device_check("update"):
            for name, model in models.items():  # the first steps create the AdamW states of every model
                micro, batch, _ = batches[name]
                getattr(model, UPDATES[name])(batch, len(batch), micro)
        offloaded = sum(_state_bytes(model) for name, model in models.items() if getattr(cfg, name).offload.offload_params)
        for name, model in models.items():
            micro, _, accumulated = batches[name]
            mode.reset_peak()
            with device_check(f"{name} update"):  # a later step: every model's AdamW states are resident
                getattr(model, UPDATES[name])(accumulated, len(accumulated), micro)
            results.append(PhaseResult(f"{name} update (fwd+bwd+AdamW)", (mode.peak - offloaded) / GIB, float("nan"),
                                       time.perf_counter() - start))
            log(f"  {results[-1].name}: peak {results[-1].peak_gib:.1f} GiB ({results[-1].seconds:.0f} s)")
            start = time.perf_counter()
    return results
