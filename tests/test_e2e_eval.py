"""``easyrl eval`` end to end (Ray + vLLM for real): validation of an exported Hugging Face folder without training
data, on engines that read it themselves (no FSDP model); prints the ``val/*`` metrics, writes them with the
generations table and the start-up profile to its own eval folder, and writes no checkpoint, export or run
metrics."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.e2e


def test_eval_of_an_exported_model_prints_metrics_and_writes_no_checkpoint(e2e_args, tiny_model_path, local_ray,
                                                                           tmp_path, capsys):
    from easyrl.cli import main

    run_dir = tmp_path / "easyrl" / "cpu_demo"
    model = run_dir / "huggingface"  # where the demo exports its model
    shutil.copytree(tiny_model_path("qwen2_5"), model)
    exported = sorted(p.name for p in model.iterdir())
    args = e2e_args("qwen2_5", tmp_path, "data.train_files=null", "data.max_response_length=16",
                    "worker.rollout.limit_images=0", "trainer.val_generations_to_log=2", f"model={model}")
    local_ray()
    status = main(["eval", *args])
    assert status == 0
    out = capsys.readouterr().out
    (summary,) = [line for line in out.splitlines() if line.startswith("easyrl eval: ")]
    assert str(model) in summary and "val/reward/overall=" in summary and "val/response_length/mean=" in summary

    (metrics_file,) = run_dir.glob("eval/*/metrics.jsonl")
    (row,) = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert row["step"] == 0 and 0.0 <= row["val/reward/overall"] <= 1.0 and row["val/response_length/mean"] > 0
    assert len(row["val/generations"]) == 2 and {"prompt", "response", "score"} <= set(row["val/generations"][0])
    assert f"val/reward/overall={row['val/reward/overall']:.4g}" in summary  # printed = written
    # engines only: they read the folder themselves; no FSDP model was built (the start-up profile, seconds)
    startup = {k.removeprefix("timing_s/startup/"): v for k, v in row.items() if k.startswith("timing_s/startup/")}
    print("EVAL startup", {k: round(v, 1) for k, v in startup.items()})
    assert startup["engine"] > 0 and startup["validation"] > 0 and "actor" not in startup
    # nothing else written: no checkpoint, no tracker, no run metrics, the model folder untouched
    assert not list(tmp_path.rglob("global_step_*")) and not list(tmp_path.rglob("checkpoint_tracker.json"))
    assert not (run_dir / "metrics.jsonl").exists()
    assert sorted(p.name for p in model.iterdir()) == exported
    assert sorted(p.name for p in metrics_file.parent.iterdir()) == ["config.yaml", "metrics.jsonl"]
