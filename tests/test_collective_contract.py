"""The collective contract (``easyrl.workers.collectives``) on two real gloo ranks running FSDP2 (symmetric ranks pass
it in every multi-rank e2e test of the suite, which runs with it on): each planted asymmetry (a skipped all-gather, an extra one at the method's end, one FSDP2 unit run twice on one
rank: S2-B's shape) fails on both ranks naming the call, in seconds instead of a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from easyrl.workers import collectives

REPO = Path(__file__).resolve().parents[1]
PLANTS = ("skip", "extra", "tower")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[str]]:
    """Each plant's two ``rank_R.txt`` (the torchrun jobs run at once)."""
    out = {plant: tmp_path_factory.mktemp(plant) for plant in PLANTS}
    jobs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(REPO / "tests/scripts/contract_ranks.py"), plant, str(out[plant])],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for plant in PLANTS]
    for job in jobs:
        _, err = job.communicate(timeout=300)  # a hang would end here, not in the assertions
        assert job.returncode == 0, err[-3000:]
    return {plant: [(out[plant] / f"rank_{r}.txt").read_text() for r in (0, 1)] for plant in PLANTS}


@pytest.mark.parametrize("plant, first, rank0, rank1", [
    ("skip", 0, "all_gather_single(torch.float32[4] cpu, torch.float32[2] cpu)",
     "all_gather_single(torch.float32[144]"),
    ("extra", None, "all_gather_single(torch.float32[4] cpu, torch.float32[2] cpu)", "end of step"),
    ("tower", 3, "all_gather_single(torch.float32[144] cpu", "all_gather_single(torch.float32[68] cpu"),
])
def test_a_planted_asymmetric_collective_fails_on_both_ranks_naming_the_call(ranks, plant, first, rank0, rank1):
    for message in ranks[plant]:
        assert "differs between ranks (NCCL/HCCL would hang here)" in message and "during step" in message, message
        assert f"rank 0: {rank0}" in message and f"rank 1: {rank1}" in message, message
        if first is not None:
            assert message.startswith(f"Collective #{first} on process group 'default_pg' (ranks [0, 1])"), message


def test_a_host_tensor_on_a_device_only_group_is_named():
    nccl_group = SimpleNamespace(_device_types=[torch.device("cuda")], group_desc="default_pg")
    with pytest.raises(collectives.CollectiveMismatch, match=r"all_reduce on process group 'default_pg' got a cpu "
                                                             r"tensor torch.float32\[3\], but its backend serves "
                                                             r"\['cuda'\] only"):
        collectives._describe("all_reduce", nccl_group, {"tensor": torch.ones(3)})
    uneven = {"tensor_list": [torch.ones(2)], "tensor": torch.ones(5)}  # all_gather's shapes may differ by rank
    cpu_group = SimpleNamespace(_device_types=[torch.device("cpu")])
    assert collectives._describe("all_gather", cpu_group, uneven) == "all_gather(torch.float32 cpu)"


def test_the_switch_is_the_config_key_or_the_environment(monkeypatch):
    monkeypatch.delenv(collectives.ENV, raising=False)
    assert not collectives.contract_on(False) and collectives.contract_on(True)
    monkeypatch.setenv(collectives.ENV, "1")
    assert collectives.contract_on(False)
