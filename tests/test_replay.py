"""A replay of a rollout dump (``trainer.load_rollout_data_dir``, docs/replay.md) without Ray: the placement it
decides (no engines, the dumped run's staleness, the weight-sync check), the parts it starts (``TrainOnly``: workers
of ``Parts(engine=False)``; no judge or reward-model phase), its batch source (``ReplayBatches``), and the trainer's
step with stand-in workers: a step that dumps, replayed, hands its update the very same tensors and gives the same
metrics."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.config.placement import Placement

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m", "worker.rollout.n=2"]


def _config(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*BASE, *overrides])


def _replay_config(folder, *overrides):
    return _config(f"trainer.load_rollout_data_dir={folder}", "data.val_files=null", *overrides)


# -- the decision, made once from the config -----------------------------------------------------------------------


def test_a_replay_places_no_engines_and_keeps_the_dumped_runs_staleness(tmp_path):
    assert _config().placement.engines
    assert _replay_config(tmp_path).placement == Placement(False, 0, 4, 0, engines=False)
    split = ["trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=1"]
    assert _replay_config(tmp_path, *split).placement == Placement(False, 1, 4, 0, engines=False)
    # the dumped samples of a colocated run are the checkpoint's weights': vLLM's log-probs are checked against the
    # recomputed ones (the right checkpoint loaded); a split run's are older: not checked
    assert _replay_config(tmp_path).sync_check_threshold == 0.1
    assert _replay_config(tmp_path, *split).sync_check_threshold is None


def test_a_replay_starts_workers_without_engines(tmp_path, monkeypatch):
    import easyrl.trainer.placement as placement
    from easyrl.workers.fsdp_worker import Parts

    started = []

    class Group:  # stands in for WorkerGroup: records what it was asked to start
        def __init__(self, config, device, **kwargs):
            started.append(kwargs)

    monkeypatch.setattr(placement, "WorkerGroup", Group)
    parts = placement.start_placement(_replay_config(tmp_path), "cpu", training_steps=2)
    assert isinstance(parts, placement.TrainOnly) and parts.engines is None
    assert [kwargs["parts"] for kwargs in started] == [Parts(engine=False)]
    batches = parts.batches(None, None, lambda: None, 2)
    assert isinstance(batches, placement.ReplayBatches) and batches.folder == str(tmp_path)
    rollout = parts.rollout(None, None)
    assert rollout.slot_occupancy() is None
    with pytest.raises(RuntimeError, match="no rollout engines"):
        rollout.generate(None, None)
    started.clear()
    assert isinstance(placement.start_placement(_config(), "cpu"), placement.Colocated)
    assert [kwargs.get("parts") for kwargs in started] == [None]  # the default Parts(): models and engine


def test_a_replay_runs_no_judge_or_reward_model_phase(tmp_path, tiny_model_path):
    from easyrl.trainer.scoring import ModelRewards

    # the scorer loads only the tokenizer here: any model folder does
    model = [f"worker.reward.reward_model.model_path={tiny_model_path('qwen2_5')}"]
    workers = SimpleNamespace(world_size=2)
    assert ModelRewards.create(_config(*model), None, workers).reward_model is not None
    replayed = ModelRewards.create(_replay_config(tmp_path, *model), None, workers)  # the dumped scores hold it
    assert replayed.reward_model is None and replayed.judging is None


# -- the trainer's step with stand-in workers ----------------------------------------------------------------------

BSZ, PROMPT, RESPONSE = 8, 3, 4


def _policy_log_probs(batch) -> torch.Tensor:
    """The stand-in actor's log-probs: a function of each sample's tokens alone (as a real forward is)."""
    return -(batch["responses"] % 7).float() / 10 - 0.01


class _Workers:
    """Stands in for the WorkerGroup: deterministic passes; records every tensor the actor's update received."""

    world_size = dp_size = 2

    def __init__(self):
        self.passes, self.updates = [], []

    def run_split(self, method, batch):
        name = method.__name__
        self.passes.append(name)
        if name == "compute_log_probs":
            return [_policy_log_probs(batch)]
        if name == "compute_ref_log_probs":
            return [-(batch["responses"] % 5).float() / 10]
        assert name == "update_actor", name
        self.updates.append({key: batch[key].clone() for key in batch.tensors.keys()})
        metrics = {"actor/pg_loss": [float((batch["advantages"] * batch["response_mask"]).sum())]}
        if "old_log_probs" not in batch:  # on-policy: the update's own log-probs (FSDPWorker.update_actor)
            metrics["old_log_probs"] = _policy_log_probs(batch)
        return [metrics]


def _generated() -> Batch:
    """A generated and scored batch of 4 prompts x 2 samples, vLLM's log-probs those of the stand-in actor."""
    from easyrl.trainer.rollout import trajectory_batch

    g = torch.Generator().manual_seed(0)
    prompts = Batch(TensorDict({"prompts": torch.randint(1, 50, (BSZ, PROMPT), generator=g),
                                "prompt_mask": torch.ones(BSZ, PROMPT, dtype=torch.long)}, batch_size=[BSZ]),
                    {"uid": [f"u{i // 2}" for i in range(BSZ)], "ground_truth": ["1"] * BSZ})
    lengths = [4, 2, 3, 1, 4, 4, 2, 3]
    responses = [torch.randint(1, 50, (n,), generator=g).tolist() for n in lengths]
    batch = trajectory_batch(prompts, responses, RESPONSE, 0)
    batch["rollout_log_probs"] = _policy_log_probs(batch) * batch["response_mask"]
    scores = torch.zeros(BSZ, RESPONSE)
    for i, n in enumerate(lengths):
        scores[i, n - 1] = float(i % 2 == 0) + 0.25 * (i % 3)
    batch["token_level_scores"] = scores
    batch["score/overall"] = scores.sum(-1).tolist()
    return batch


def _trainer(config, batches):
    from easyrl.trainer.placement import NoRollout
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the step alone: no Ray, no models, no data
    trainer.config = config
    trainer.global_step, trainer._last_frac_zero_std, trainer.startup, trainer.model_shape = 2, None, None, None
    trainer.workers, trainer.batches = _Workers(), batches
    trainer.generator = SimpleNamespace(rollout=NoRollout())
    trainer.model_rewards = SimpleNamespace(run=lambda *args: None)
    return trainer


@pytest.mark.parametrize("overrides, passes", [
    ([], ["compute_log_probs", "compute_ref_log_probs", "update_actor"]),  # cpu_demo: 2 mini-batches, KL loss
    (["worker.actor.global_batch_size=4", "algorithm.use_kl_loss=false"], ["update_actor"]),  # on-policy
], ids=["recompute", "on_policy"])
def test_a_dumped_step_replays_to_the_same_update(tmp_path, overrides, passes):
    from easyrl.trainer.batch_source import ReplayBatches
    from easyrl.trainer.metrics import MEASURED_PREFIXES
    from easyrl.trainer.rollout_dump import RolloutDump, read_step, step_info

    folder = str(tmp_path / "rollouts")
    original = _trainer(_config(f"trainer.rollout_data_dir={folder}", *overrides), SimpleNamespace(
        next_batch=lambda *args: (_generated(), None, {}, 1), step_done=lambda metrics: None))
    original.rollout_dump = RolloutDump(folder, -1, position=lambda: {"epoch": 0, "loader": {"yielded": 8}})
    metrics = original.train_step(iter(()))
    assert original.workers.passes == passes
    dumped = read_step(folder, 2)  # the trained batch, in generation order, its passes' tensors included
    for key in original.last_batch.tensors.keys():
        assert torch.equal(dumped[key], original.last_batch[key]), key
    assert dumped["uid"] == original.last_batch["uid"]

    source = ReplayBatches(folder)
    replay = _trainer(_replay_config(folder, *overrides), source)
    replayed = replay.train_step(iter(()))  # an empty prompt stream: nothing is drawn from it
    assert replay.workers.passes == passes
    (before,), (after,) = original.workers.updates, replay.workers.updates
    assert sorted(after) == sorted(before)  # on-policy: no old log-probs reach the update (recomputed ones dropped)
    for key, tensor in before.items():
        assert torch.equal(after[key], tensor), key  # same samples, same order, same advantages
    def unmeasured(values):
        return {k: v for k, v in values.items() if not k.startswith(MEASURED_PREFIXES)}

    assert unmeasured(replayed) == unmeasured(metrics)  # reward/errors included: the dumped run's count (1)
    assert replayed["reward/errors"] == 1.0 and "timing_s/replay" in replayed and "timing_s/gen" not in replayed
    assert unmeasured(step_info(folder, 2)["metrics"]) == unmeasured(metrics)
    assert source.prompt_position() == {"epoch": 0, "loader": {"yielded": 8}}  # a replay's checkpoint continues there
    source.restart(2, None)
    assert source.prompt_position() is None


def test_the_trainer_holds_the_dump_writer_of_its_config(tmp_path, tiny_model_path, monkeypatch):
    """``init_workers`` with a stand-in placement: ``trainer.rollout_data_dir`` gives a writer whose manifest names
    the run and whose position is the prompt stream's; none without the key."""
    import json

    import easyrl.trainer.ray_trainer as ray_trainer
    from easyrl.trainer.placement import NoRollout

    def trainer_of(*overrides):
        trainer = ray_trainer.RayPPOTrainer.__new__(ray_trainer.RayPPOTrainer)
        trainer.config = _config(f"worker.actor.model.model_path={tiny_model_path('qwen2_5')}",
                                 f"trainer.runs_root={tmp_path}", *overrides)
        trainer.tokenizer = trainer.train_dataset = trainer.val_dataset = trainer.scorer = None
        trainer.pad_id, trainer.training_steps = 0, 2
        trainer.train_dataloader = SimpleNamespace(state_dict=lambda: {"epoch": 7})
        workers = SimpleNamespace(world_size=2, run_all=lambda method: ["cpu"])
        monkeypatch.setattr(ray_trainer, "start_placement", lambda *args: SimpleNamespace(
            workers=workers, rollout=lambda tokenizer, dataset: NoRollout(),
            batches=lambda *args: SimpleNamespace(prompt_position=lambda: None)))
        trainer.init_workers("cpu")
        return trainer

    assert trainer_of().rollout_dump is None
    folder = tmp_path / "rollouts"
    dump = trainer_of(f"trainer.rollout_data_dir={folder}").rollout_dump
    assert dump.folder == str(folder) and dump.limit == -1 and dump.position() == {"epoch": 7}
    manifest = json.loads((folder / "dump.json").read_text())
    assert manifest["run_dir"] == str(tmp_path / "easyrl" / "cpu_demo") and manifest["training_steps"] == 2
    assert manifest["samples"]["worker.rollout.n"] == 2 and manifest["identity"]["model"]["model_type"] == "qwen2"


def test_a_relative_dump_in_a_config_file_is_found_next_to_it(tmp_path, monkeypatch):
    (tmp_path / "dump").mkdir()
    (tmp_path / "replay.yaml").write_text("trainer:\n  load_rollout_data_dir: dump\n")
    monkeypatch.chdir(REPO)  # another folder than the file's
    config = load_config([f"config={tmp_path / 'replay.yaml'}", "worker.actor.model.model_path=m",
                          "data.val_files=null"])
    assert config.trainer.load_rollout_data_dir == str(tmp_path / "dump")
