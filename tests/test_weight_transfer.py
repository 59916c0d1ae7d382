"""The split placement's transfer group (easyrl.workers.weight_transfer) on the CPU: the HCCL options it builds on NPUs
(device review 2026-12-02, S2-N2: built with empty ``global_ranks_in_group`` it became the process's global group,
and with ``RANK_TABLE_FILE`` set its communicator came from the cluster's rank table), and a LoRA actor's plan and
sent weights over a 2-rank gloo group (two threads): the merged model's names and values, as the colocated sync's."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from easyrl import envvars
from easyrl.workers import weight_transfer

# the fields torch_npu's _new_process_group_hccl_helper sets (torch_npu 2.10.0.post4, torch_npu/_init/registry/
# distributed.py; the Options binding's names in torch_npu/csrc/distributed/Init.cpp)
HELPER_FIELDS = {"is_high_priority_stream", "_timeout", "global_ranks_in_group", "group_id"}


def test_hccl_options_make_a_sub_group_with_an_id_of_its_own():
    timeout = timedelta(seconds=60)
    options = weight_transfer.hccl_options(3, 29512, timeout, {})
    assert set(options) == HELPER_FIELDS
    assert options["global_ranks_in_group"] == [0, 1, 2]  # non-empty: torch_npu's global group is the empty list's
    assert options["_timeout"] == timeout and options["is_high_priority_stream"] is False
    # one id per group (the store's port), the same on every member (they all pass the same port)
    assert options["group_id"] == weight_transfer.hccl_options(3, 29512, timeout, {})["group_id"]
    assert options["group_id"] != weight_transfer.hccl_options(3, 29513, timeout, {})["group_id"]


@pytest.mark.parametrize("value, refused", [("1", True), (" 2", True), ("0", False), ("", False), ("no", False)])
def test_sub_communicators_derived_from_the_global_group_are_refused(value, refused):
    """``ROOTINFO_SUBCOMM_ENABLE`` (read as torch_npu does: strtol, non-zero on) derives a sub-group's communicator
    from the process's global group, whose members are the trainer's (or vLLM's) ranks, not the transfer group's."""
    environ = {"ROOTINFO_SUBCOMM_ENABLE": value}
    if refused:
        with pytest.raises(RuntimeError, match="ROOTINFO_SUBCOMM_ENABLE is on"):
            weight_transfer.hccl_options(2, 1, timedelta(seconds=1), environ)
    else:
        weight_transfer.hccl_options(2, 1, timedelta(seconds=1), environ)


def test_the_rank_table_is_unset_only_while_the_communicator_is_built(monkeypatch):
    monkeypatch.setenv(weight_transfer.RANK_TABLE_ENV, "/etc/hccl/rank_table.json")
    with envvars.replaced(os.environ, weight_transfer.RANK_TABLE_ENV, None):  # as create_group does
        assert weight_transfer.RANK_TABLE_ENV not in os.environ
    assert os.environ[weight_transfer.RANK_TABLE_ENV] == "/etc/hccl/rank_table.json"
    monkeypatch.delenv(weight_transfer.RANK_TABLE_ENV)
    with envvars.replaced(os.environ, weight_transfer.RANK_TABLE_ENV, None):
        pass
    assert weight_transfer.RANK_TABLE_ENV not in os.environ


def _lora_state(tiny_model_path):
    """A one-rank FSDP2 LoRA actor's (tiny Qwen2.5, adapter on every linear layer) ``state_dict()`` with a non-zero
    ``lora_B`` (peft starts it at 0, so the merge would change nothing), its Hugging Face model class's instance
    from the checkpoint and its ``alpha / rank``."""
    from easyrl.models.hf_folder import hf_model_class
    from easyrl.models.lora import lora_scale
    from tests.test_lora import _lora_actor

    path, hf_config, config, model = _lora_actor(tiny_model_path)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.to_local().copy_(torch.randn(p.to_local().shape) * 0.05)  # one rank: the whole tensor
    plain = hf_model_class(hf_config).from_pretrained(path, dtype=torch.float32)
    return model.state_dict(), plain, lora_scale(config.model.lora)


BUCKET = 2**16  # bytes: the tiny model's weights in many buckets


def _colocated(state, scale, dtype):
    """What the colocated sync hands vLLM (``weight_sync.sync_weights``' stream), name for name and in order."""
    from easyrl.models.lora import merge_lora_stream
    from easyrl.workers.weight_sync import iter_full_weights

    return list(merge_lora_stream(iter_full_weights(state, torch.device("cpu"), dtype, BUCKET), scale))


def test_a_lora_plan_names_the_merged_hugging_face_weights(process_group, tiny_model_path):
    state, plain, scale = _lora_state(tiny_model_path)
    plan = weight_transfer.make_plan(state, torch.bfloat16, BUCKET, lora_scale=scale)
    planned = [(name, shape) for bucket in plan for name, shape in bucket]
    assert len(plan) > 1
    # the colocated sync's names and shapes, in its order, and those of the plain model's checkpoint (vLLM's names)
    assert planned == [(name, list(t.shape)) for name, t in _colocated(state, scale, torch.bfloat16)]
    assert dict(planned) == {name: list(t.shape) for name, t in plain.state_dict().items()}


def test_a_lora_actor_sends_the_merged_weights_over_a_two_rank_group(process_group, tiny_model_path):
    import socket
    import threading

    state, _, scale = _lora_state(tiny_model_path)
    cpu, dtype = torch.device("cpu"), torch.bfloat16
    plan = weight_transfer.make_plan(state, dtype, BUCKET, lora_scale=scale)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    received, errors = {}, []

    def rollout_rank() -> None:  # the transfer group's rank 1, as RolloutWorker.receive_weights
        try:
            group = weight_transfer.open_group("127.0.0.1", port, 1, 2, "cpu", 60)
            received.update((name, t.clone()) for name, t in weight_transfer.receive(group, plan, cpu, dtype))
        except Exception as err:  # noqa: BLE001 (re-raised below)
            errors.append(err)

    thread = threading.Thread(target=rollout_rank, daemon=True)
    thread.start()
    group = weight_transfer.open_group("127.0.0.1", port, 0, 2, "cpu", 60)
    weight_transfer.send(group, state, plan, cpu, dtype, lora_scale=scale)
    thread.join(60)
    assert not errors and not thread.is_alive()
    colocated = _colocated(state, scale, dtype)
    assert list(received) == [name for name, _ in colocated]
    for name, want in colocated:  # bit for bit what the colocated sync gives vLLM
        assert torch.equal(received[name], want), name
    # ... which is W + scale * B @ A of the actor's float32 tensors (to bf16 rounding), not W
    full = {name: t.full_tensor() if hasattr(t, "full_tensor") else t for name, t in state.items()}
    module = "model.layers.0.self_attn.q_proj"
    w = full[f"{module}.base_layer.weight"]
    merged = w + scale * full[f"{module}.lora_B.default.weight"] @ full[f"{module}.lora_A.default.weight"]
    assert torch.allclose(received[f"{module}.weight"].float(), merged, rtol=1e-2, atol=1e-3)
    assert not torch.allclose(received[f"{module}.weight"].float(), w, rtol=1e-2, atol=1e-3)


def test_a_plan_of_another_lora_setting_is_refused(process_group, tiny_model_path):
    state, _, scale = _lora_state(tiny_model_path)
    plain_plan = weight_transfer.make_plan(state, torch.bfloat16, BUCKET)  # peft's names: no merge
    with pytest.raises(RuntimeError, match="base_layer.*another model or LoRA setting"):
        weight_transfer.send(None, state, plain_plan, torch.device("cpu"), torch.bfloat16, lora_scale=scale)


class _RecordingGroup:
    """A transfer group that records when each broadcast is posted and waited for (the schedule alone: the data
    path runs over gloo in the tests above)."""

    def __init__(self):
        self.events: list[str] = []
        self.posted = 0

    def broadcast(self, tensors, options):
        index, self.posted = self.posted, self.posted + 1
        self.events.append(f"post {index}")
        events = self.events

        class Work:
            def wait(self):
                events.append(f"wait {index}")

        return Work()


def test_two_buckets_are_in_flight_on_each_side():  # device review S3-N9
    """The trainer's rank 0 posts bucket b + 1's broadcast before waiting for bucket b's (its gather overlaps b's
    broadcast); a rollout rank has b + 1 posted while the consumer reads b, and posts b + 2 only once b is read (two
    flat buffers at most on each side)."""
    state = {f"w{i}": torch.ones(4, 4) for i in range(4)}
    plan = weight_transfer.make_plan(state, torch.float32, 64)  # one 4 x 4 float32 tensor per bucket
    assert len(plan) == 4
    sender = _RecordingGroup()
    weight_transfer.send(sender, state, plan, torch.device("cpu"), torch.float32)
    assert sender.events == ["post 0", "post 1", "wait 0", "post 2", "wait 1", "post 3", "wait 2", "wait 3"]
    receiver = _RecordingGroup()
    for name, _ in weight_transfer.receive(receiver, plan, torch.device("cpu"), torch.float32):
        receiver.events.append(f"read {name}")
    assert receiver.events == ["post 0", "post 1", "wait 0", "read w0", "post 2", "wait 1", "read w1", "post 3",
                               "wait 2", "read w2", "wait 3", "read w3"]
