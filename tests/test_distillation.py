"""On-policy distillation's parts without Ray: the advantage math (``easyrl.algorithms.distillation``), the trainer's
mixing step, the config properties, the teacher's memory and role settings; several teachers (``worker.teachers``):
the config's one list of teachers, the source -> teacher routing, the per-teacher metric, each teacher's memory and
forward, and a worker scoring only its rows of a teacher in as many forwards as its peers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage
from easyrl.algorithms.distillation import (
    add_distillation,
    on_policy_distill_advantage,
    reverse_kl_metrics,
    token_reverse_kl,
)
from easyrl.config import load_config
from easyrl.config.actor import route_teachers, teacher_of_source, teachers_of
from easyrl.errors import DataError

CONFIG = f"config={Path(__file__).resolve().parents[1] / 'config.yaml'}"

# two samples, three response positions; the second sample's last position is padding
STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -7.0]])
TEACHER = torch.tensor([[-2.0, -1.0, -0.5], [-1.0, -0.6, -1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _config(*overrides):
    return load_config([CONFIG, "worker.actor.model.model_path=m", *overrides])


def test_token_reverse_kl_is_student_minus_teacher_on_response_tokens_only():
    kl = token_reverse_kl(STUDENT, TEACHER, MASK)
    # by hand: log pi_student - log pi_teacher; the padded position is 0 whatever its log-probs
    assert torch.equal(kl, torch.tensor([[1.0, -1.0, 0.0], [-2.0, 0.5, 0.0]]))
    # mean over the 5 response tokens: (1 - 1 + 0 - 2 + 0.5) / 5
    assert reverse_kl_metrics(kl, MASK) == {"distill/reverse_kl": pytest.approx(-1.5 / 5)}


def test_token_reverse_kl_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="bsz, resp_len"):
        token_reverse_kl(STUDENT, TEACHER[:, :2], MASK)


def test_pure_distillation_advantage_is_the_negative_reverse_kl_with_discount_zero():
    inputs = AdvantageInputs(torch.zeros(2, 3), MASK, np.array(["a", "a"]), old_log_probs=STUDENT,
                             teacher_log_probs=TEACHER)
    advantages, returns = compute_advantage("on_policy_distill", inputs)
    # each token judged alone (no return over later tokens): a token the teacher likes more than the student gets a
    # positive advantage, one the student overrates a negative one
    expected = torch.tensor([[-1.0, 1.0, 0.0], [2.0, -0.5, 0.0]])
    assert torch.equal(advantages, expected) and torch.equal(returns, expected)
    # rewards are not used
    rewarded = AdvantageInputs(torch.full((2, 3), 5.0), MASK, np.array(["a", "b"]), old_log_probs=STUDENT,
                               teacher_log_probs=TEACHER)
    assert torch.equal(on_policy_distill_advantage(rewarded)[0], expected)


def test_pure_distillation_needs_both_log_probs():
    with pytest.raises(ValueError, match="teacher_log_probs"):
        on_policy_distill_advantage(AdvantageInputs(torch.zeros(2, 3), MASK, np.array(["a", "a"]),
                                                    old_log_probs=STUDENT))


def test_mixed_advantage_subtracts_coef_times_reverse_kl():
    rl = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    mixed = add_distillation(rl, token_reverse_kl(STUDENT, TEACHER, MASK), 0.1)
    assert torch.allclose(mixed, torch.tensor([[0.4, 0.6, 0.5], [-0.3, -0.55, 0.0]]))


def test_trainer_mixes_the_reverse_kl_into_grpo_advantages_and_reports_it():
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the advantage phase alone: no workers, datasets or reward
    trainer.config = _config("algorithm.distill_coef=0.5", "worker.teacher.model.model_path=t")
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    batch = Batch({"token_level_rewards": scores, "response_mask": MASK, "old_log_probs": STUDENT,
                   "teacher_log_probs": TEACHER}, {"uid": ["a", "a"]})
    trainer._compute_advantage(batch)
    grpo = batch["advantages"].clone()
    metrics = trainer._distill(batch)
    assert torch.allclose(batch["advantages"], grpo - 0.5 * token_reverse_kl(STUDENT, TEACHER, MASK))
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.3)


def test_needs_teacher_and_the_old_log_prob_pass():
    plain = _config()
    assert not plain.algorithm.needs_teacher and plain.on_policy_update is not None
    mixed = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                    "data.rollout_batch_size=128", "worker.actor.global_batch_size=128")
    pure = _config("algorithm.adv_estimator=on_policy_distill", "worker.teacher.model.model_path=t",
                   "data.rollout_batch_size=128", "worker.actor.global_batch_size=128")
    for config in (mixed, pure):
        # the reverse KL needs the student's log-probs before the update: never the on-policy shortcut
        assert config.algorithm.needs_teacher and not config.on_policy_update
    assert mixed.worker.teacher.micro_batch_size_per_device_for_experience == \
        mixed.worker.actor.micro_batch_size_per_device_for_experience


def test_teacher_memory_is_its_shard_in_the_compute_dtype_unless_offloaded():
    from easyrl.sizing.anatomy import GIB
    from easyrl.sizing.estimate import estimate_memory

    on_device = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                        "worker.teacher.offload.offload_params=false")
    estimate = estimate_memory(1_700_000_000, 151_936, on_device, 80.0, teacher_params=[8_000_000_000])
    teacher = 2 * 8e9 / on_device.world_size / GIB  # bf16 shard of an 8B teacher over 8 devices
    assert estimate.rollout["teacher"] == pytest.approx(teacher)
    assert estimate.training["teacher"] == pytest.approx(teacher)
    offloaded = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t")
    assert estimate_memory(1_700_000_000, 151_936, offloaded, 80.0, teacher_params=[8_000_000_000]).training[
        "teacher"] == 0.0
    assert "teacher" not in estimate_memory(1_700_000_000, 151_936, _config(), 80.0).training


def test_teacher_role_takes_the_actors_sharding_and_its_own_trust_remote_code():
    from easyrl.workers.roles import teacher_role_config

    config = _config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t",
                     "worker.teacher.model.trust_remote_code=true", "worker.actor.model.lora.rank=8")
    role = teacher_role_config(config, teachers_of(config.worker)[0])
    assert role.fsdp == config.worker.actor.fsdp and role.padding_free == config.worker.actor.padding_free
    assert role.model.trust_remote_code and not config.worker.actor.model.trust_remote_code  # a copy


def test_pure_distillation_does_not_warn_of_constant_rewards(caplog):
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    batch = Batch({"token_level_scores": torch.zeros(2, 3)}, {"uid": ["a", "a"]})
    for estimator, warns in (("on_policy_distill", False), ("grpo", True)):
        trainer = RayPPOTrainer.__new__(RayPPOTrainer)
        trainer.config = _config(f"algorithm.adv_estimator={estimator}", "worker.teacher.model.model_path=t")
        trainer.global_step, trainer._last_frac_zero_std = 1, None
        caplog.clear()
        assert trainer._check_reward_variance(batch) == 1.0
        # the reward is not in a pure distillation's advantage: "all advantages are 0" would be false
        assert ("all advantages are 0" in caplog.text) == warns


TWO_TEACHERS = ("algorithm.adv_estimator=on_policy_distill", "worker.teachers.math.model.model_path=big-math",
                "worker.teachers.math.data_sources=[gsm8k,math]", "worker.teachers.chat.model.model_path=big-chat",
                "worker.teachers.chat.default=true", "worker.teachers.chat.offload.offload_params=false")


def test_the_single_teacher_is_the_one_default_teacher_and_worker_teachers_keep_their_order():
    single = teachers_of(_config("algorithm.distill_coef=0.1", "worker.teacher.model.model_path=t").worker)
    assert [(t.name, t.key, t.model.model_path, t.data_sources, t.default, t.label) for t in single] == [
        ("teacher", "worker.teacher", "t", (), True, "teacher")]
    several = teachers_of(_config(*TWO_TEACHERS).worker)
    assert [(t.name, t.key, t.model.model_path, t.data_sources, t.default, t.offload.offload_params, t.label)
            for t in several] == [
        ("math", "worker.teachers.math", "big-math", ("gsm8k", "math"), False, True, "teacher math"),
        ("chat", "worker.teachers.chat", "big-chat", (), True, False, "teacher chat")]
    assert teachers_of(_config().worker) == []


def test_relative_teacher_paths_in_a_yaml_are_looked_up_from_its_folder(tmp_path):
    (tmp_path / "math-teacher").mkdir()
    (tmp_path / "run.yaml").write_text(
        "algorithm:\n  adv_estimator: on_policy_distill\nworker:\n  teachers:\n    math:\n      model:\n"
        "        model_path: math-teacher\n      default: true\n")
    config = load_config([f"config={tmp_path / 'run.yaml'}", "worker.actor.model.model_path=m"])
    assert config.worker.teachers["math"].model.model_path == str(tmp_path / "math-teacher")


def test_each_row_goes_to_the_teacher_naming_its_source_else_the_default():
    teachers = teachers_of(_config(*TWO_TEACHERS).worker)
    # a named source -> its teacher; an unnamed one and a row without data_source (None) -> the default
    assert route_teachers(teachers, ["math", "chat", "gsm8k", None, "other"]) == [0, 1, 0, 1, 1]
    no_default = [teachers[0]]
    assert teacher_of_source(no_default, "other") is None
    with pytest.raises(DataError, match=r"row 1 has data_source='other'.*worker\.teachers\.math\.data_sources"):
        route_teachers(no_default, ["gsm8k", "other"])


def test_data_sources_reads_each_samples_column_and_none_without_one():
    from easyrl.batch import Batch
    from easyrl.trainer.rollout import data_sources

    from tensordict import TensorDict

    tensors = TensorDict({"response_mask": MASK}, batch_size=[2])
    assert data_sources(Batch(tensors, {"columns": [{"data_source": "math"}, {"answer": 3}]})) == ["math", None]
    assert data_sources(Batch(tensors)) == [None, None]


def test_reverse_kl_is_also_reported_per_teacher_over_its_own_samples():
    kl = token_reverse_kl(STUDENT, TEACHER, MASK)  # [[1, -1, 0], [-2, 0.5, (pad)]]
    metrics = reverse_kl_metrics(kl, MASK, torch.tensor([1, 0]), ["math", "chat", "code"])
    assert metrics == {"distill/reverse_kl": pytest.approx(-1.5 / 5), "distill/reverse_kl/math": pytest.approx(-0.75),
                       "distill/reverse_kl/chat": pytest.approx(0.0)}  # code: no sample this step, no metric


def test_trainer_reports_each_teachers_reverse_kl_with_several_teachers():
    from easyrl.batch import Batch
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config = _config(*TWO_TEACHERS)
    batch = Batch({"token_level_rewards": torch.zeros(2, 3), "response_mask": MASK, "old_log_probs": STUDENT,
                   "teacher_log_probs": TEACHER, "teacher_index": torch.tensor([0, 1])}, {"uid": ["a", "a"]})
    trainer._compute_advantage(batch)
    metrics = trainer._distill(batch)
    assert metrics["distill/reverse_kl/math"] == pytest.approx(0.0)
    assert metrics["distill/reverse_kl/chat"] == pytest.approx(-0.75)


def test_every_teacher_is_counted_in_memory_and_has_its_own_forward():
    from easyrl.sizing.anatomy import GIB, ModelShape
    from easyrl.sizing.estimate import estimate_memory
    from easyrl.sizing.experience import RoleModel, estimate_experience

    config = _config(*TWO_TEACHERS)
    estimate = estimate_memory(1_700_000_000, 151_936, config, 80.0, teacher_params=[8_000_000_000, 4_000_000_000])
    chat = 2 * 4e9 / config.world_size / GIB  # resident: its bf16 shard beside the actor in both phases
    assert estimate.training["teacher chat"] == pytest.approx(chat) and estimate.rollout["teacher chat"] == \
        pytest.approx(chat)
    assert estimate.training["teacher math"] == 0.0  # offloaded: on the host instead, per node
    assert estimate.host["teacher math"] == pytest.approx(2 * 8e9 / config.world_size / GIB *
                                                          config.trainer.n_gpus_per_node)
    shape = ModelShape(hidden_size=2048, num_layers=28, intermediate_size=6144, tied=True)
    phases = estimate_experience(estimate, config, RoleModel(1_700_000_000, 151_936, shape),
                                 [RoleModel(8_000_000_000, 151_936, shape), RoleModel(4_000_000_000, 151_936, shape)])
    assert {"teacher math forward", "teacher chat forward"} <= set(phases)


def test_a_worker_scores_only_its_rows_of_a_teacher_in_as_many_forwards_as_its_peers(process_group, monkeypatch):
    import torch.distributed as dist

    from types import SimpleNamespace

    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.workers.trainable import FSDPTrainable

    class Stub(FSDPTrainable):  # just what _score_responses reads: fixed-size micro-batches of a text model
        def __init__(self):
            self.model = SimpleNamespace(eval=lambda: None)
            self.config = SimpleNamespace(max_token_len_per_device=None, dynamic_batching=False)
            self.sp, self.vision, self.torch_device = None, SimpleNamespace(has_vision=False), torch.device("cpu")

    data = Batch(TensorDict({"response_mask": torch.ones(3, 2, dtype=torch.long), "attention_mask": torch.ones(3, 4),
                             "row": torch.tensor([[10.0], [20.0], [30.0]])}, batch_size=[3]))
    forwards = []

    def score(micro):  # each row's id as its log-probs
        forwards.append(micro["row"].flatten().tolist())
        return micro["row"].expand(-1, 2)

    stub = Stub()
    out = stub._score_responses(data, 2, score, rows=[0, 2])
    assert out.tolist() == [[10.0, 10.0], [0.0, 0.0], [30.0, 30.0]] and forwards == [[10.0, 30.0]]
    forwards.clear()  # no rank has a row of this teacher (one rank here): no forward anywhere
    assert stub._score_responses(data, 2, score, rows=[]).eq(0).all() and forwards == []
    real = dist.all_reduce
    for peer, rows, expected in ((3, [1], [[20.0], [10.0], [10.0]]), (2, [], [[10.0], [10.0]])):
        # a peer has `peer` micro-batches of this teacher: this rank pads its own with filler forwards
        forwards.clear()
        monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, n=peer: (real(t, op=op), t.fill_(n)))
        out = stub._score_responses(data, 2, score, rows=rows)
        assert forwards == expected and out[[0, 2]].eq(0).all() and out[1].eq(20.0 if rows else 0.0).all()


def test_the_worker_gives_each_teacher_its_rows_and_joins_their_scores():
    from types import SimpleNamespace

    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.workers.fsdp_worker import FSDPWorker

    class Teacher:  # scores every row with its own constant, 0 outside its rows (as FSDPPolicy.compute_log_probs)
        def __init__(self, value):
            self.value, self.rows = value, []

        def compute_log_probs(self, data, micro_batch_size, temperature, rows=None):
            self.rows.append(rows)
            out = torch.zeros(data["response_mask"].shape)
            out[list(range(len(data))) if rows is None else rows] = self.value
            return out

    worker = FSDPWorker.__new__(FSDPWorker)  # the teacher pass alone
    worker.config = _config(*TWO_TEACHERS)
    worker.mm_stage = SimpleNamespace(attach=lambda data: data)
    worker.teachers = [Teacher(-1.0), Teacher(-2.0)]
    data = Batch(TensorDict({"response_mask": torch.ones(3, 2), "teacher_index": torch.tensor([1, 0, 1])},
                            batch_size=[3]))
    assert worker.compute_teacher_log_probs(data)[:, 0].tolist() == [-2.0, -1.0, -2.0]
    assert [t.rows for t in worker.teachers] == [[[1]], [[0, 2]]]
    worker.teachers = [Teacher(-3.0)]  # one teacher: the whole share, as before several teachers
    assert worker.compute_teacher_log_probs(data)[:, 0].tolist() == [-3.0] * 3 and worker.teachers[0].rows == [None]
