"""The split placement's transfer group (easyrl.workers.weight_transfer) on the CPU: the HCCL options it builds on NPUs
(device review 2026-12-02, S2-N2: built with empty ``global_ranks_in_group`` it became the process's global group,
and with ``RANK_TABLE_FILE`` set its communicator came from the cluster's rank table)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

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
    with weight_transfer._unset(weight_transfer.RANK_TABLE_ENV):
        assert weight_transfer.RANK_TABLE_ENV not in os.environ
    assert os.environ[weight_transfer.RANK_TABLE_ENV] == "/etc/hccl/rank_table.json"
    monkeypatch.delenv(weight_transfer.RANK_TABLE_ENV)
    with weight_transfer._unset(weight_transfer.RANK_TABLE_ENV):
        pass
    assert weight_transfer.RANK_TABLE_ENV not in os.environ
