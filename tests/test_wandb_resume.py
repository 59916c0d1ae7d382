"""A resumed run continues the same wandb run: the run id is kept in ``<run_dir>/wandb_run_id`` and passed back to
``wandb.init(id=..., resume="allow")``; a new run gets a new id; entity, group and tags reach the run (offline)."""

from __future__ import annotations

import pytest

from easyrl.trainer.loggers import WANDB_ID_FILE, WandbLogger


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_a_resumed_run_keeps_its_wandb_run(tmp_path, offline):
    config = {"trainer": {"wandb_group": "sweep-1", "wandb_tags": ["grpo", "demo"], "wandb_entity": None}}
    first = WandbLogger(str(tmp_path), "easyrl-test", "demo", config)
    first.log({"x": 1.0}, step=1)
    first_id, group, tags = first.run.id, first.run.group, tuple(first.run.tags)
    first.close()
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == first_id
    assert group == "sweep-1" and tags == ("grpo", "demo")

    resumed = WandbLogger(str(tmp_path), "easyrl-test", "demo", config, resume=True)
    resumed.log({"x": 2.0}, step=2)
    assert resumed.run.id == first_id
    resumed.close()

    fresh = WandbLogger(str(tmp_path), "easyrl-test", "demo", config, resume=False)
    assert fresh.run.id != first_id
    fresh.close()
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == fresh.run.id
