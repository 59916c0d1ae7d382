"""The ``easyrl`` command: one entry with train | eval | export | plot | --version, each help naming itself; bare
``easyrl`` prints the help; ``python -m easyrl.trainer`` (EasyR1's entry) and ``python -m easyrl.export`` keep
working, the latter's help in plain text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]


def test_bare_easyrl_prints_the_help_with_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: easyrl")
    for name in ("train", "eval", "export", "plot", "--version"):
        assert name in out
    assert set(COMMANDS) >= {"train", "eval", "export", "plot"}


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("easyrl ")


@pytest.mark.parametrize("command", ["train", "eval", "export", "plot"])
def test_each_help_names_itself(command, capsys):
    try:
        status = main([command, "--help"])
    except SystemExit as stop:  # argparse's help (export, plot)
        status = stop.code
    assert status == 0
    out = capsys.readouterr().out
    assert f"usage: easyrl {command}" in out
    assert "python -m" not in out.split("\n", 1)[0]
    assert "``" not in out and ":func:" not in out


def test_module_entries_keep_their_own_names():
    for module in ("easyrl.trainer", "easyrl.export", "easyrl.eval"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: python -m {module}"), proc.stdout[:200]
        assert "``" not in proc.stdout and ":func:" not in proc.stdout  # plain text, no Sphinx markup


def test_unknown_command_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["trian"])
    assert stop.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize("words, line", [
    (["train", "config=nowhere.yaml"], "easyrl: config error: Config file 'nowhere.yaml' (from config=) does not"),
    (["eval", "config=nowhere.yaml"], "easyrl: config error: Config file 'nowhere.yaml' (from config=) does not"),
    (["simulate", "config=nowhere.yaml"], "easyrl: config error: Config file 'nowhere.yaml'"),
    (["export", "{tmp}/nowhere", "{tmp}/out"], "easyrl: run error: {tmp}/nowhere is not a checkpoint"),
    (["export", "{tmp}/nowhere", "{tmp}"], "easyrl: export error: {tmp} exists; give a new folder"),
    (["plot", "{tmp}/nowhere"], "easyrl: run error: {tmp}/nowhere/metrics.jsonl does not exist"),
], ids=["train", "eval", "simulate", "X07", "X08", "X09"])
def test_every_command_reports_a_user_error_in_one_line(words, line, tmp_path, capsys, monkeypatch):
    """Each command shares ``easyrl.errors.run_cli``: one ``easyrl: <kind> error:`` line, status 2, no traceback."""
    monkeypatch.delenv("EASYRL_DEBUG", raising=False)
    assert main([word.format(tmp=tmp_path) for word in words]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line.format(tmp=tmp_path)) and "Traceback" not in err
