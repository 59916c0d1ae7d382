"""Environment variables easyrl cannot read (``easyrl.envvars``), each answered before Ray starts with one line naming
the variable, its value, where it was set, what is accepted and what to do (docs/errors.md, E01-E09)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl import envvars
from easyrl.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _config(*words: str):
    """A finalized config of ``words`` (a model path given: load_config requires one; nothing is loaded)."""
    return load_config([*words, "worker.actor.model.model_path=some/model"])

CASES = [
    ("E01", {"EASYRL_CHECK_COLLECTIVES": "maybe"}, [],
     ["EASYRL_CHECK_COLLECTIVES='maybe' is not a switch (1, true, yes, on / 0, false, no, off, in any case), in the "
      "environment; write EASYRL_CHECK_COLLECTIVES=1 to turn it on or EASYRL_CHECK_COLLECTIVES=0"]),
    ("E02", {"EASYRL_PEAK_TFLOPS": "fast"}, [],
     ["EASYRL_PEAK_TFLOPS='fast' is not a number > 0 (one device's dense peak in TFLOP/s), in the environment; "
      "write e.g. EASYRL_PEAK_TFLOPS=1"]),
    ("E03", {}, ["worker.env_vars={OMP_NUM_THREADS: '2', EASYRL_VERBOSE: loud}"],
     ["EASYRL_VERBOSE='loud' is not a switch (1, true, yes, on / 0, false, no, off, in any case), in worker.env_vars; "
      "write EASYRL_VERBOSE=1"]),
]


@pytest.mark.parametrize("cid, environ, words, culprits", CASES, ids=[case[0] for case in CASES])
def test_bad_environment_value(cid, environ, words, culprits, expect_user_error):
    """The pre-flight (``check_environment``) refuses the planted value as one ``env`` line through the CLI's
    handler."""
    config = _config(*words)
    expect_user_error(lambda: envvars.check_environment(config, environ), "env", *culprits)


def test_the_pre_flight_reads_the_environment_first(monkeypatch, expect_user_error):  # E05
    """``prepare`` (before Ray, in ``easyrl train`` and ``easyrl eval``) reads the environment before anything else:
    a bad value is answered ahead of the config's missing training set; a good one lets that answer come."""
    from easyrl.trainer.preflight import prepare

    config = _config("data.train_files=null")  # prepare's next check refuses it
    monkeypatch.setenv("EASYRL_VERBOSE", "sometimes")
    expect_user_error(lambda: prepare(config), "env", "EASYRL_VERBOSE='sometimes' is not a switch")
    monkeypatch.setenv("EASYRL_VERBOSE", "Off")
    expect_user_error(lambda: prepare(config), "config", "data.train_files is not set")


def test_bad_switch_through_the_real_command_before_ray(tmp_path):  # E07
    """``easyrl train`` with a bad switch: exit status 2, one line, no traceback, Ray never started."""
    proc = subprocess.run(
        [sys.executable, "-m", "easyrl.cli", "train", f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
         "worker.actor.model.model_path=./no/such/model", f"trainer.runs_root={tmp_path}"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "EASYRL_DEBUG": "maybe", "EASYRL_CHECK_COLLECTIVES": "fasle"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # a bad EASYRL_DEBUG reads as off in the handler, so the first bad value is printed as one line
    assert proc.stderr.strip().splitlines()[-1] == (
        "easyrl: env error: EASYRL_DEBUG='maybe' is not a switch (1, true, yes, on / 0, false, no, off, in any case), "
        "in the environment; write EASYRL_DEBUG=1 to turn it on or EASYRL_DEBUG=0 (or unset it) to turn it off.")
    assert "ray" not in proc.stderr.lower()


def test_an_override_says_so_in_one_line(caplog):  # E06
    """A variable that overrides a config value is not an error: one INFO line each at start-up."""
    config = _config("trainer.device=cpu", "worker.env_vars={OMP_NUM_THREADS: '4'}")
    with caplog.at_level(logging.INFO, logger="easyrl"):
        lines = envvars.check_environment(config, {"EASYRL_CHECK_COLLECTIVES": "yes", "VLLM_CPU_KVCACHE_SPACE": "2"})
    assert lines == [
        "EASYRL_CHECK_COLLECTIVES='yes' (the environment) overrides trainer.check_collectives=false: the collective "
        "contract is on",
        "OMP_NUM_THREADS='4' (worker.env_vars) overrides the threads easyrl gives each worker "
        "(trainer.cpu_threads_per_worker=1 on the CPU)",
        "VLLM_CPU_KVCACHE_SPACE='2' (the environment) overrides worker.rollout.cpu_kvcache_space_gib=1 on the CPU "
        "backend",
    ]
    assert [record.getMessage() for record in caplog.records if record.name == "easyrl"] == lines


TRACKER_CASES = [
    ("wandb", {"WANDB_MODE": "local"}, ["WANDB_MODE='local' is not a wandb mode", "'offline'", "WANDB_MODE=offline"]),
    ("wandb", {"WANDB_MODE": "OFFLINE"}, ["WANDB_MODE='OFFLINE' is not a wandb mode"]),
    ("swanlab", {"SWANLAB_MODE": "dryrun"}, ["SWANLAB_MODE='dryrun' is not a swanlab mode", "'local'"]),
]


@pytest.mark.parametrize("backend, environ, culprits", TRACKER_CASES, ids=["wandb-local", "wandb-upper", "swanlab"])
def test_a_tracker_mode_its_library_refuses(backend, environ, culprits, monkeypatch, expect_user_error):  # E08
    """A mode variable read by the tracker's own settings (as its ``init`` reads it), before any worker starts:
    ``WANDB_MODE=local`` (swanlab's word) passed as offline before, then wandb refused it after Ray."""
    from easyrl.trainer.loggers import check_logger_credentials

    for name in ("WANDB_MODE", "WANDB_DISABLED", "SWANLAB_MODE", "WANDB_API_KEY", "SWANLAB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = _config(f"trainer.logger=[console,{backend}]")
    expect_user_error(lambda: check_logger_credentials(config.trainer), "env", *culprits)


def test_wandb_disabled_which_wandb_does_not_read(monkeypatch, expect_user_error):  # E09
    """``WANDB_DISABLED=true`` skipped the login check before, but wandb (0.31) reads only ``WANDB_MODE``: the run
    would have logged online. Off (``false``), or beside ``WANDB_MODE=disabled``, it changes nothing."""
    from easyrl.trainer.loggers import check_logger_credentials

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # logged in: only the variable is at stake
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = _config("trainer.logger=[console,wandb]")
    monkeypatch.setenv("WANDB_DISABLED", "True")
    expect_user_error(lambda: check_logger_credentials(config.trainer), "env", "WANDB_DISABLED='True'",
                      "WANDB_MODE=disabled")
    monkeypatch.setenv("WANDB_DISABLED", "false")
    check_logger_credentials(config.trainer)
    monkeypatch.setenv("WANDB_DISABLED", "true")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # what it meant, said the way wandb reads it
    check_logger_credentials(config.trainer)
