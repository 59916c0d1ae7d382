"""docs/errors.md, command-line entries (X..): the real ``python -m easyrl.trainer`` in a subprocess. Few on purpose
(each pays a Python start-up); the handler they share is checked in-process by every other catalog test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*words: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "easyrl.trainer", *words], capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "EASYRL_DEBUG": "0", **(env or {})},
    )


def test_help_prints_usage_precedence_and_where_the_config_is_documented():  # X01
    proc = _run("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: python -m easyrl.trainer [config=FILE.yaml] [KEY=VALUE ...]")
    layers = ("defaults of the dataclasses", "YAML file named by config=", "KEY=VALUE words")
    precedence = [proc.stdout.index(s) for s in layers]
    assert precedence == sorted(precedence)  # defaults <- YAML <- CLI, in that order
    assert "config.yaml" in proc.stdout and "docs/errors.md" in proc.stdout and "EASYRL_DEBUG" in proc.stdout


def test_yaml_list_is_a_config_error_with_status_2(tmp_path):  # X02
    bad = tmp_path / "list.yaml"
    bad.write_text("- data\n- worker\n")
    proc = _run(f"config={bad}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"easyrl: config error: Config file '{bad}' (from config=) holds a list at the top level; " \
                          "it must be a mapping of sections (data:, algorithm:, worker:, trainer:).\n"


def test_flag_that_is_not_key_value_points_to_help():  # X03
    proc = _run("--config", "config.yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("easyrl: config error: Command-line argument '--config'") and "--help" in proc.stderr


def test_easyrl_debug_shows_the_traceback():  # X04
    proc = _run("data.rollout_batch_size=0", "worker.actor.model.model_path=m", env={"EASYRL_DEBUG": "1"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "ConfigError: data.rollout_batch_size must be a positive number" in proc.stderr


def test_missing_local_model_is_reported_before_ray_starts(tmp_path):  # X05
    proc = _run(f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=./no/such/model",
                f"trainer.runs_root={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "easyrl: model error: worker.actor.model.model_path='./no/such/model' does not exist; give an existing local "
        "model folder or a hub id org/name"
    )
    assert "ray" not in proc.stderr.lower()  # Ray logs its start-up on stderr; it must not have started


def test_user_error_inside_a_wrapper_is_found():
    """A user error raised in a Ray worker reaches the driver as a ``RayTaskError`` that keeps it as ``.cause`` (and
    subclasses its type); one re-raised ``from`` another error is found through ``__cause__``. Bugs are not."""
    from easyrl.errors import DataError, user_error_of

    original = DataError("row 3 of 'x.jsonl': bad")

    class FakeRayTaskError(Exception):  # the shape of ray.exceptions.RayTaskError, without starting Ray
        def __init__(self, cause):
            super().__init__("Traceback of the remote task ...")
            self.cause = cause

    assert user_error_of(FakeRayTaskError(original)) is original
    try:
        try:
            raise original
        except DataError as err:
            raise RuntimeError("wrapped") from err
    except RuntimeError as wrapped:
        assert user_error_of(wrapped) is original
    assert user_error_of(ZeroDivisionError("a bug")) is None
