"""``easyrl simulate`` (easyrl/simulate): the simulated device catches what a real accelerator would refuse, naming
the call, and the command exits non-zero with the numbers for a config that cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from easyrl.simulate.__main__ import main
from easyrl.simulate.fake_device import (
    DEVICES,
    DeviceCheckError,
    accelerator_standins,
    device_check,
    fake_tensors,
    fake_world,
)

ROOT = Path(__file__).resolve().parents[1]


def planted_mix(weight: torch.Tensor) -> torch.Tensor:
    host = torch.ones(weight.shape)  # a host tensor reaching a device op: the bug
    return weight * host


def planted_collective() -> None:
    count = torch.ones(2)  # the token count left on the host: NCCL would refuse it
    dist.all_reduce(count)


def _simulated(run):
    with fake_world(0, 8), accelerator_standins(DEVICES["h100"]), fake_tensors("cuda"):
        weight = torch.empty(4, 4, device="cuda")
        with device_check("planted"):
            run(weight)


def test_host_device_mix_is_caught_naming_the_call():
    with pytest.raises(DeviceCheckError, match=r"phase 'planted': host/device mix at .*test_simulate.py:\d+ in "
                                               r"planted_mix: return weight \* host"):
        _simulated(planted_mix)


def test_collective_on_a_host_tensor_is_caught_naming_the_call():
    with pytest.raises(DeviceCheckError, match=r"host tensor in a collective at .*in planted_collective: "
                                               r"dist.all_reduce\(count\)"):
        _simulated(lambda weight: planted_collective())


def test_device_tensors_pass_and_data_dependent_code_runs():
    def run(weight):
        mask = torch.tensor([[0, 1, 1], [1, 1, 0]]).to("cuda")  # the batch's mask, moved to the device
        assert mask.sum(-1).tolist() == [2, 2]  # real values: easyrl's packing code needs them
        assert mask.bool().nonzero().shape == (4, 2)
        count = torch.tensor([3], device="cuda")
        dist.all_reduce(count)
        assert (weight @ weight).device.type == "cuda"

    _simulated(run)


def test_thirty_b_moe_on_one_80gb_gpu_without_offload_exits_nonzero_with_the_numbers(capsys):
    code = main(["config=" + str(ROOT / "config.yaml"), "worker.actor.model.model_path=Qwen/Qwen3-VL-30B-A3B-Instruct",
                 "trainer.n_gpus_per_node=1", "--device", "h100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and not out["fits"]
    assert out["capacity_gib"] == pytest.approx(79.2)
    assert out["estimate"]["vllm_weights_gib"] == pytest.approx(57.9, abs=0.1)  # 31.07e9 bf16 parameters
    assert "worker.rollout.tensor_parallel_size" in out["problem"]


def _small_model(folder: Path) -> str:
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=False).save_pretrained(folder)
    return str(folder)


def test_every_phase_runs_on_a_small_model_and_the_shards_match_a_hand_count(tmp_path, capsys):
    from transformers import AutoConfig

    from easyrl.config import load_config
    from easyrl.simulate.phases import simulate
    from easyrl.workers.memory_estimate import GIB, count_parameters

    path = _small_model(tmp_path / "model")
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={path}",
                          "data.max_prompt_length=256", "data.max_response_length=256"])
    sim = simulate(config, DEVICES["h100"])
    phases = {p.name: p for p in sim.phases}
    assert list(phases) == ["load actor", "load reference", "old log-probs (forward)", "reference forward",
                            "weight sync gather", "checkpoint state dict", "export gather",
                            "actor update (fwd+bwd+AdamW)"]
    params = count_parameters(AutoConfig.from_pretrained(path))[0]
    # after loading, rank 0 holds its float32 shard (the reference is offloaded to the host by config.yaml)
    assert phases["load actor"].resident_gib == pytest.approx(4 * params / 8 / GIB, rel=0.01)
    assert phases["load reference"].resident_gib == pytest.approx(phases["load actor"].resident_gib, rel=0.01)
    # rank 0 broadcasts the checkpoint tensor by tensor: the largest full float32 tensor on top of the shard
    assert phases["load actor"].peak_gib == pytest.approx((4 * params / 8 + 4 * 1024 * 256) / GIB, rel=0.01)
    assert all(p.peak_gib > 0 for p in sim.phases)
