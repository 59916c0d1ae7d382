"""A worker that tests can look into: ``InspectableWorker``, the runtime ``FSDPWorker`` plus the methods that only tests
call (full weights, snapshots, new loss settings between steps, vLLM's scoring of a fixed sequence).

A test builds its trainer with it, ``build_trainer(config, worker_cls=InspectableWorker)``, and calls the methods by
reference like the trainer does, e.g. ``trainer.workers.run_all(InspectableWorker.actor_state_dict)[0]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch

from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils._pytree import tree_map_only

from easyrl.config import PPOConfig
from easyrl.trainer.parity import vllm_score
from easyrl.workers.checkpoint import _load_training_state, _training_state
from easyrl.workers.fsdp_model import gather_full
from easyrl.workers.fsdp_worker import FSDPWorker


class InspectableWorker(FSDPWorker):
    """``FSDPWorker`` with test-only methods (each called on every rank together through ``WorkerGroup.run_all``):

    * ``actor_state_dict``: the actor's full weights on the host, to compare before and after an update, across
      ranks, or with an export;
    * ``snapshot_actor`` / ``restore_actor``: keep the actor's training state in memory and return to it, to run two
      updates from the same start (e.g. one per loss setting);
    * ``update_config``: adopt new loss settings between steps (the trainer's config changed by the test);
    * ``rollout_score``: vLLM's teacher-forced log-probs of a fixed sequence, to check that the engine holds exactly
      the actor's weights;
    * ``break_sync``: plant a silently broken weight sync (one tensor skipped, reported written).
    """

    def _actor_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's full tensors on the compute device, gathered one at a time (peak memory: one full tensor),
        HF names; offloaded shards are moved to the device before the gather (NCCL/HCCL take device tensors only)."""
        for name, tensor in self.actor.model.state_dict().items():
            yield name, gather_full(tensor, self.torch_device)

    def actor_state_dict(self) -> dict[str, torch.Tensor]:
        """Full actor weights on the host (every rank must call it; all receive them)."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self._actor_weights()}

    def snapshot_actor(self) -> None:
        """Keep an in-memory copy of the actor's training state on this worker: cloned sharded model and optimizer
        state dicts (DTensors stay sharded), LR schedule and counters."""
        model_state, optim_state = get_state_dict(self.actor.model, self.actor.optimizer)
        self._actor_snapshot = {"model": _clone_tree(model_state), "optim": _clone_tree(optim_state),
                                **_training_state(self.actor)}

    def restore_actor(self) -> None:
        """Return the actor to the last ``snapshot_actor`` (all workers together: the optimizer state load is
        collective); the rollout weights go stale."""
        state = self._actor_snapshot
        set_state_dict(self.actor.model, self.actor.optimizer, model_state_dict=_clone_tree(state["model"]),
                       optim_state_dict=_clone_tree(state["optim"]))
        _load_training_state(self.actor, state)
        self.weights_dirty = True

    def update_config(self, config: PPOConfig) -> None:
        """Adopt new loss settings between steps (``worker.actor``: loss_type, loss_agg_mode, clip ratios, KL and
        entropy coefficients, ppo_epochs, ...; ``algorithm.*``). Model, optimizer, FSDP and vLLM engine settings
        were fixed at start-up and are not re-applied."""
        self.config = config
        self.actor.config = config.worker.actor
        if self.critic is not None:
            self.critic.config = config.worker.critic
        self.rollout.config = config.worker.rollout

    def rollout_score(self, token_ids: list[int], images: list[Any],
                      videos: Optional[list[Any]] = None) -> tuple[list[int], list[float]]:
        """vLLM's log-probs of ``token_ids[1:]`` (weights synced first if stale); see ``easyrl.trainer.parity.vllm_score``."""
        self._ensure_rollout_weights()
        self.rollout.wake_up()
        scores = vllm_score(self.rollout, token_ids, images, videos)
        self.sleep_rollout()
        return scores

    def break_sync(self, name: str) -> None:
        """Every weight sync from now on leaves the Hugging Face tensor ``name`` out of what vLLM receives but reports it
        written: vLLM keeps its old values (start-up dummy ones before the first sync), a broken sync that
        ``weight_sync.check_all_loaded`` cannot see and the sync check must."""
        load = self.rollout.load_weights

        def skipping(named_tensors):
            expected, loaded = load((key, tensor) for key, tensor in named_tensors if key != name)
            return expected, sorted({*loaded, name})

        self.rollout.load_weights = skipping


def actor_log_probs_of(trainer, batch, response: list[int]) -> torch.Tensor:
    """The actor's log-probs ``(len(response),)`` of the fixed ``response`` after the first prompt of ``batch`` (a
    generated batch of a ``trainer``; its responses, masks and ids are replaced in place by ``response``)."""
    batch["responses"][:, :] = trainer.pad_id
    batch["responses"][:, : len(response)] = torch.tensor(response)
    batch["response_mask"].zero_()
    batch["response_mask"][:, : len(response)] = 1
    batch["input_ids"] = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    batch["attention_mask"] = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1)
    return torch.cat(trainer.workers.run_split(FSDPWorker.compute_log_probs, batch))[0, : len(response)]


def _clone_tree(value: Any) -> Any:
    """A copy of a (nested) state dict in which every tensor is cloned (DTensors stay sharded)."""
    return tree_map_only(torch.Tensor, lambda tensor: tensor.detach().clone(), value)
