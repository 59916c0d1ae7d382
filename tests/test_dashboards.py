"""Every logger writes real files (offline: no network) that read back to the JSONL's keys and values: a wandb
offline run folder, TensorBoard event files (tensorboard's reader), an MLflow file store, a SwanLab offline run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from easyrl.config import ConfigError, load_config
from easyrl.config.trainer import check_backends, install_hint
from easyrl.trainer.loggers import Tracker

STEPS = [
    {"actor/pg_loss": 0.5, "critic/score/mean": 0.25, "perf/throughput": 120.0, "timing_s/step": 3.5},
    {"actor/pg_loss": -0.125, "critic/score/mean": 0.75, "perf/throughput": 130.0, "timing_s/step": 3.25,
     "val/reward/overall": 0.5},
]
GENERATIONS = [{"prompt": "What is 1+1?", "response": "<think>easy</think> \\boxed{2}", "ground_truth": "2",
                "score": 1.0},
               {"prompt": "Angle A?", "response": "no idea", "ground_truth": "30", "score": 0.0}]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One run through every backend (offline modes), two steps; the second with validation generations."""
    mp = pytest.MonkeyPatch()
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SWANLAB_MODE": "offline",
                       "SWANLAB_TERMINAL_PROXY_TYPE": "none"}.items():
        mp.setenv(key, value)
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("SWANLAB_LOGDIR", raising=False)
    path = tmp_path_factory.mktemp("run")
    tracker = Tracker(["console", "jsonl", "tensorboard", "wandb", "swanlab", "mlflow"], str(path), "easyrl-test",
                      "dash", {"trainer": {"max_steps": 2}}, total_steps=2)
    tracker.log(STEPS[0], step=1)
    tracker.log(STEPS[1], step=2, generations=GENERATIONS)
    tracker.close()
    mp.undo()
    return path


def _jsonl(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row.pop("step"): row for row in rows}


def _scalars(rows: dict[int, dict]) -> dict[int, dict]:
    return {step: {k: v for k, v in row.items() if isinstance(v, float)} for step, row in rows.items()}


def test_jsonl_has_metrics_and_generations(run_dir):
    rows = _jsonl(run_dir)
    assert _scalars(rows) == {1: STEPS[0], 2: STEPS[1]}
    assert rows[2]["val/generations"] == GENERATIONS and "val/generations" not in rows[1]


def test_tensorboard_events_read_back(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    got: dict[int, dict] = {}
    for key in events.Tags()["scalars"]:
        for event in events.Scalars(key):
            got.setdefault(event.step, {})[key] = pytest.approx(event.value)
    assert got == _scalars(_jsonl(run_dir))
    text = events.Tensors("val/generations/text_summary")[0]
    assert text.step == 2 and b"| Angle A? | no idea | 30 | 0.0 |" in text.tensor_proto.string_val[0]


def test_wandb_offline_run_reads_back(run_dir):
    from swanlab.converter.wb.wbdatastore import WBDataStoreReader  # a reader of wandb's transaction log
    from wandb.proto import wandb_internal_pb2

    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    got: dict[int, dict] = {}
    with WBDataStoreReader() as reader:
        reader.open(run_file)
        while (data := reader.scan()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                got[items["_step"]] = {k: v for k, v in items.items() if not k.startswith(("_", "val/generations"))}
                if "val/generations/_type" in items:
                    got[items["_step"]]["table"] = items["val/generations/nrows"]
    expected = _scalars(_jsonl(run_dir))
    expected[2]["table"] = len(GENERATIONS)
    assert got == expected
    (table,) = run_dir.glob("wandb/offline-run-*/files/media/table/val/generations_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["step", "prompt", "response", "ground_truth", "score"]
    assert data["data"][0] == [2, *GENERATIONS[0].values()]


def test_mlflow_file_store_reads_back(run_dir):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("easyrl-test").experiment_id])
    assert run.info.run_name == "dash" and run.info.status == "FINISHED"
    got: dict[int, dict] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            got.setdefault(metric.step, {})[key] = metric.value
    assert got == _scalars(_jsonl(run_dir))
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "val_generations/step_000002.json")).read_text())
    assert table["data"][1] == [2, *GENERATIONS[1].values()]
    config = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json")).read_text())
    assert config == {"trainer": {"max_steps": 2}}


def test_swanlab_offline_run_reads_back(run_dir):
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (run_file,) = run_dir.glob("swanlog/run-*/run-*.swanlab")
    got: dict[int, dict] = {}
    tables = []
    reader = DataStoreReader()
    reader.open(run_file)
    for data in reader:
        record = record_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "scalar":
            got.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
        elif kind == "media":
            tables.append((record.media.key, record.media.step))
    reader.close()
    assert got == _scalars(_jsonl(run_dir))
    assert tables == [("val/generations", 2)]


@pytest.mark.parametrize("installed, hint", [
    ({"vllm", "pytest", "wandb"}, "uv sync --locked --extra gpu --extra dev --extra wandb --extra swanlab from the "
                                  "checkout (uv sync removes the extras it is not given), or uv pip install swanlab "
                                  "into the active environment"),
    ({"vllm-ascend"}, 'uv pip install -e ".[npu,swanlab]" from the checkout'),  # no lock for the Ascend host
])
def test_install_hint_repeats_the_installed_extras(installed, hint, monkeypatch):
    """``uv sync --extra swanlab`` alone would remove vLLM (the gpu extra): the hint names every installed extra."""
    import importlib.metadata

    def distribution(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert install_hint("swanlab") == hint


def test_missing_library_fails_at_config_load_with_an_install_hint(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    with pytest.raises(ValueError, match=r"swanlab is not installed: uv sync --locked (--extra \w+ )*--extra swanlab "
                                         r"from the checkout .* or uv pip install swanlab into the active environment"):
        check_backends(["console", "swanlab"])
    demo = Path(__file__).resolve().parents[1] / "examples/configs/cpu_demo.yaml"
    with pytest.raises(ConfigError, match=r"trainer.logger contains 'swanlab'"):
        load_config([f"config={demo}", "worker.actor.model.model_path=m", "trainer.logger=[console,swanlab]"])
    with pytest.raises(ConfigError, match="unknown backend 'neptune'; choose from console, jsonl"):
        load_config([f"config={demo}", "worker.actor.model.model_path=m", "trainer.logger=[neptune]"])
