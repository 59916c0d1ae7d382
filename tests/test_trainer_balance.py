"""The trainer's per-step rank balancing: a permutation with balanced shares, its metrics, and the way back."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.trainer.ray_trainer import RayPPOTrainer
from easyrl.workers.fsdp_worker import FSDPWorker


def _trainer(balance: bool, world: int) -> RayPPOTrainer:
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only the pieces _balance reads
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(balance_batch=balance))
    trainer.workers = SimpleNamespace(world_size=world, dp_size=world)
    return trainer


def _batch(lengths, width=100):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return Batch(TensorDict({"attention_mask": mask}, batch_size=[len(lengths)]), {"uid": list(range(len(lengths)))})


def test_balance_gives_equal_token_shares_and_is_undone_by_argsort():
    lengths = [90, 85, 80, 10, 12, 8, 70, 5]  # the long samples first: consecutive shares would be 265 vs 95 tokens
    batch = _batch(lengths)
    metrics = {}
    order = _trainer(True, 2)._balance(batch, metrics)
    assert sorted(order) == list(range(8))
    shares = [sum(lengths[i] for i in order[:4]), sum(lengths[i] for i in order[4:])]
    assert abs(shares[0] - shares[1]) <= 10
    assert metrics["perf/max_rank_tokens_ratio"] < 1.05
    assert metrics["perf/padding_fraction"] == 1 - sum(lengths) / 800
    restored = batch.select(order).select(np.argsort(order).tolist())
    assert restored["uid"] == list(range(8))
    off = {}
    assert _trainer(False, 2)._balance(batch, off) == list(range(8))
    assert off["perf/max_rank_tokens_ratio"] > 1.4


def test_worker_batches_leave_driver_only_extras_behind():
    from easyrl.trainer.rollout import for_workers

    batch = _batch([3, 4])
    batch["images"] = [["a PIL image"], []]
    batch["multi_modal_inputs"] = [{"pixel_values": torch.zeros(2, 3)}, {}]
    sent = for_workers(batch)
    assert set(sent.extras) == {"multi_modal_inputs"} and sent.tensors is batch.tensors


def test_generation_gets_the_images_but_not_the_processor_outputs():
    from easyrl.trainer.rollout import for_rollout

    batch = _batch([3, 4])
    batch["images"] = [["a PIL image"], []]
    batch["multi_modal_inputs"] = [{"pixel_values": torch.zeros(2, 3)}, {}]
    batch["columns"] = [{"solution": "1"}, {"solution": "2"}]  # for the reward function only
    sent = for_rollout(batch)
    assert set(sent.extras) == {"uid", "images"} and sent.tensors is batch.tensors


def test_the_trainer_stages_images_once_and_nothing_for_text():
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.mm_staging import STAGE_KEY

    calls = []
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.workers = SimpleNamespace(world_size=2, run_split=lambda method, batch: calls.append((method, batch)))
    text = _batch([3, 4, 5, 6])
    text["multi_modal_inputs"] = [{}] * 4
    assert trainer._stage_multi_modal(text) is None and calls == []  # a text batch pays nothing
    vl = _batch([3, 4, 5, 6])
    vl["multi_modal_inputs"] = [{"pixel_values": torch.zeros(2, 3)}, {}, {}, {}]
    refs = trainer._stage_multi_modal(vl)
    [(method, staged)] = calls
    assert method is FSDPWorker.stage_multi_modal and staged[STAGE_KEY] == refs and len(refs) == 4
    assert staged["multi_modal_inputs"] == vl["multi_modal_inputs"] and not list(staged.tensors.keys())
