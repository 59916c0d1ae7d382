"""The console: the per-step summary line, the progress bar, and the filters that drop library noise."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

import pytest

from easyrl.quiet import NOISE, WARNINGS, quiet_libraries, worker_env
from easyrl.trainer.loggers import ConsoleLogger, summary_line

METRICS = {
    "critic/score/mean": 0.41234, "reward/accuracy": 0.25, "response_length/mean": 37.5, "actor/kl_loss": 0.00123,
    "actor/entropy": 1.2345, "timing_s/step": 41.23, "perf/throughput": 95.6, "actor/pg_loss": 0.5,
}


def test_summary_line_shows_the_watched_metrics_in_order():
    assert summary_line(METRICS, 3, 10) == (
        "step 3/10 | reward 0.412 acc 0.250 | len 37.5 | kl 0.0012 | ent 1.23 | 41.2s | 96 tok/s/dev")
    # KL in the reward instead of the loss, validation, MFU; absent fields are left out
    line = summary_line({"actor/reward_kl_penalty": 0.5, "val/reward/overall": 0.3, "perf/mfu/actor": 0.123}, 0)
    assert line == "step 0 | kl 0.5000 | mfu 12.3% | val 0.300"
    agent = {"response_length/mean": 90.0, "multi_turn/tool_calls_per_traj/mean": 1.5, "multi_turn/tool_errors": 2.0}
    assert summary_line(agent, 1) == "step 1 | len 90.0 | tools 1.50/sample errors 2"


def test_console_logger_moves_the_bar_and_prints_each_step(capsys):
    console = ConsoleLogger(total_steps=4)
    console.log({"val/reward/overall": 0.1}, step=0)  # validation before training: no bar movement
    assert console.bar.n == 0
    console.log(METRICS, step=1)
    console.log(METRICS, step=2)
    assert console.bar.n == 2 and console.bar.postfix == "reward=0.412"
    console.close()
    err = capsys.readouterr().err
    assert "step 0/4 | val 0.100" in err and "step 2/4 | reward 0.412" in err
    assert "training:  50%" in err  # tqdm's bar: 2 of 4 steps


def _emit(name: str, message: str, *args) -> list[str]:
    """Messages that reach a handler of logger ``name`` (propagation off, like vLLM's own logger)."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    target = logging.getLogger(name)
    target.addHandler(handler)
    try:
        target.warning(message, *args)
    finally:
        target.removeHandler(handler)
    return seen


def test_noise_is_dropped_and_real_warnings_kept(monkeypatch):
    monkeypatch.delenv("EASYRL_VERBOSE", raising=False)
    quiet_libraries()
    layerwise = "vllm.model_executor.model_loader.reload.layerwise"
    assert _emit(layerwise, "%s: Failed to load weights", "MRotaryEmbedding") == []
    assert _emit(layerwise, "%s: Failed to load weights", "FusedMMInputNorm") == []
    # a layer with real weights that failed to load is a real problem: kept
    kept = _emit(layerwise, "%s: Failed to load weights", "Qwen2Attention")
    assert kept == ["Qwen2Attention: Failed to load weights"]
    assert _emit("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. For best", "libtcmalloc") == []
    assert _emit("vllm.v1.worker.cpu_worker", "Node 1 is not in available memory nodes") != []
    assert _emit("vllm.engine.arg_utils", "The global random seed is set to 1.") == []
    loader = "vllm.model_executor.models.utils"
    cast = "Attempted to load weight %s with dtype %s into parameter with dtype %s"
    assert _emit(loader, cast, "layers.0.mlp.down_proj.weight", "torch.float32", "torch.bfloat16") == []  # the judge's
    assert _emit(loader, cast, "norm.weight", "torch.float16", "torch.bfloat16") != []  # not a plain narrowing: kept
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_libraries()  # re-applies the ignore filters after simplefilter
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ...", FutureWarning)
        warnings.warn("'set_vital' is deprecated, please do not call", UserWarning)  # torchdata's, every epoch
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


def test_noise_table_points_at_real_modules():
    """Each filtered logger is a module of the installed library (a vLLM upgrade that moves one shows up here)."""
    for name, _, reason in NOISE:
        top = name.split(".")[0]
        spec = importlib.util.find_spec(top)  # locates the package without importing it
        assert spec is not None, top
        root = Path(spec.submodule_search_locations[0])
        module = root.joinpath(*name.split(".")[1:])
        assert module.with_suffix(".py").exists() or module.is_dir(), (name, reason)
    assert all(issubclass(category, Warning) for _, category in WARNINGS)


def test_worker_env_switches(monkeypatch):
    monkeypatch.delenv("EASYRL_VERBOSE", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    env = worker_env()
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING" and env["TQDM_DISABLE"] == "1"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    assert worker_env()["VLLM_LOGGING_LEVEL"] == "DEBUG"  # vLLM's own switch wins
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    monkeypatch.setenv("EASYRL_VERBOSE", "1")
    assert worker_env() == {"EASYRL_VERBOSE": "1", "VLLM_LOGGING_LEVEL": "INFO"}


@pytest.fixture(autouse=True)
def _restore_filters():
    """The filters installed by a test stay off other tests' loggers."""
    yield
    for name, _, _ in NOISE:
        logging.getLogger(name).filters.clear()
