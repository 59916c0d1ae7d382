"""#20: a hub id is resolved to a local snapshot on every node before the process group exists, instead of rank 0
downloading inside the weight broadcast while the other ranks wait under the collective timeout. No hub here: the
decision and the local-path case are tested, the download is a stand-in."""

from __future__ import annotations

from easyrl.models.hub_snapshot import local_model_path


def test_local_folders_and_unset_paths_are_not_downloaded(tmp_path):
    def no_download(repo_id):
        raise AssertionError(f"downloaded {repo_id}")

    assert local_model_path(str(tmp_path), no_download) == str(tmp_path)
    assert local_model_path("./models/q", no_download) == "./models/q"
    assert local_model_path("models/qwen/7b", no_download) == "models/qwen/7b"  # not org/name: a relative folder
    assert local_model_path(None, no_download) is None


def test_a_hub_id_becomes_its_snapshot_folder(tmp_path):
    asked = []

    def download(repo_id):
        asked.append(repo_id)
        return str(tmp_path / "snapshot")

    assert local_model_path("Qwen/Qwen2.5-VL-7B-Instruct", download) == str(tmp_path / "snapshot")
    assert asked == ["Qwen/Qwen2.5-VL-7B-Instruct"]


def test_workers_fetch_before_the_process_group(monkeypatch, tmp_path):
    """The worker points its actor/critic/tokenizer paths at local folders; WorkerGroup calls it before
    init_process_group (so no collective timeout runs during a download)."""
    import inspect

    from easyrl.config import PPOConfig
    from easyrl.models import hub_snapshot
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.group import WorkerGroup

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker sets it; restored after the test
    monkeypatch.setattr(hub_snapshot, "snapshot_download", lambda repo_id: f"/snapshots/{repo_id}")
    config = PPOConfig()
    config.worker.actor.model.model_path = "Qwen/Qwen3-VL-8B-Instruct"
    config.worker.actor.model.tokenizer_path = str(tmp_path)
    worker = FSDPWorker(config, rank=0, world_size=1, device="cpu")
    worker.fetch_model_files()
    assert worker.config.worker.actor.model.model_path == "/snapshots/Qwen/Qwen3-VL-8B-Instruct"
    assert worker.config.worker.actor.model.tokenizer_path == str(tmp_path)
    source = inspect.getsource(WorkerGroup.__init__)
    assert source.index("FSDPWorker.fetch_model_files") < source.index("FSDPWorker.init_process_group")
