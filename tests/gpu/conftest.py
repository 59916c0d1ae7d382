"""GPU tests (marker ``gpu``, run by ``make test-gpu``): skipped where no CUDA device is visible, so the default
``make test`` on a CPU machine collects and skips them."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(scope="module")
def nccl_group(tmp_path_factory):
    """A one-rank NCCL process group on GPU 0, built here (no Ray, no torchrun)."""
    import torch.distributed as dist

    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("nccl") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()
