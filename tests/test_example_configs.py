"""Every shipped configuration loads: ``config.yaml``, each YAML under ``examples/configs/`` and the override list of each
``examples/*.sh`` launch script (the words after ``python3 -m easyrl.trainer``, with the script's variables expanded).

No model, data or device is touched: ``load_config`` only parses, checks keys and finalizes.
"""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

from easyrl.config import PPOConfig, auto_keys, load_config, valid_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(glob.glob(os.path.join(ROOT, "examples", "configs", "*.yaml"))) + [os.path.join(ROOT, "config.yaml")]
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "examples", "*.sh")))
ENTRY = ("-m", "easyrl.trainer")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def script_overrides(text: str, where: str) -> list[str]:
    """The ``key=value`` words a launch script passes to ``python3 -m easyrl.trainer``.

    Backslash-continued lines are joined; shell variables set by plain ``NAME=value`` lines are substituted;
    ``"$@"`` (the caller's extra overrides) is dropped. Fails when the script has no trainer call or uses a variable it
    does not set.
    """
    lines = text.replace("\\\n", " ").splitlines()
    variables: dict[str, str] = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        if len(words) == 1 and ASSIGNMENT.match(words[0]):
            name, value = words[0].split("=", 1)
            variables[name] = value
    calls = [shlex.split(line, comments=True) for line in lines if "easyrl.trainer" in line.split("#", 1)[0]]
    assert len(calls) == 1, f"{where}: expected one `python3 -m easyrl.trainer` line, found {len(calls)}"
    words = calls[0]
    start = next((i + 2 for i in range(len(words) - 1) if tuple(words[i : i + 2]) == ENTRY), None)
    assert start is not None, f"{where}: the trainer call is not `python3 -m easyrl.trainer ...`"

    def expand(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"{where}: variable ${name} is used but not set in the script"
        return variables[name]

    return [VARIABLE.sub(expand, word) for word in words[start:] if word != "$@"]


def test_parser_handles_continuations_variables_and_extra_args():
    text = (
        "#!/bin/bash\nset -x\nMODEL=some/model  # a comment\n"
        "python3 -m easyrl.trainer \\\n    config=c.yaml \\\n    a.b=${MODEL} \\\n    c.d='x y' \\\n    \"$@\"\n"
    )
    assert script_overrides(text, "inline") == ["config=c.yaml", "a.b=some/model", "c.d=x y"]


def test_parser_rejects_unset_variable():
    with pytest.raises(AssertionError, match=r"\$UNSET"):
        script_overrides("python3 -m easyrl.trainer a.b=$UNSET\n", "inline")


def test_examples_exist():
    assert len(YAMLS) >= 2 and SCRIPTS, "examples/configs/*.yaml and examples/*.sh must not be empty"


@pytest.mark.parametrize("path", YAMLS, ids=_rel)
def test_yaml_loads(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the files name their prompt templates and reward functions relative to the repo root
    config = load_config([f"config={_rel(path)}", "worker.actor.model.model_path=some/model"])
    reward = config.worker.reward.reward_function
    for named in (config.data.format_prompt, reward.rsplit(":", 1)[0] if reward else None):
        if named is not None:
            assert os.path.isfile(named), f"{_rel(path)} names {named}, which does not exist"


@pytest.mark.parametrize("path", SCRIPTS, ids=_rel)
def test_script_overrides_load(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # scripts are run from the repository root
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("#!/bin/bash") and "\nset -x\n" in text, f"{_rel(path)}: needs a bash shebang and set -x"
    words = script_overrides(text, _rel(path))
    assert any(w.startswith("config=") for w in words), f"{_rel(path)}: no config=... argument"
    assert any(w.startswith("worker.actor.model.model_path=") for w in words), f"{_rel(path)}: no model path"
    config = load_config(words)
    assert config.worker.actor.model.model_path
    # every override really lands in the config (catches e.g. a value that the YAML parser reads differently)
    for word in words:
        key, value = word.split("=", 1)
        if key == "config":
            continue
        node = config
        for part in key.split("."):
            node = getattr(node, part)
        if isinstance(node, bool):
            assert str(node).lower() == value.lower(), f"{_rel(path)}: {key}={value} gave {node!r}"
        elif isinstance(node, (int, float)):
            assert node == float(value), f"{_rel(path)}: {key}={value} gave {node!r}"
        elif isinstance(node, str):
            assert node == value, f"{_rel(path)}: {key}={value} gave {node!r}"


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.endswith("_npu.sh")], ids=_rel)
def test_npu_recipes_carry_the_source_recipes_environment(path, monkeypatch):
    """#20: the Ascend recipes set HCCL's timeouts and jemalloc on the workers, as the source recipes do."""
    monkeypatch.chdir(ROOT)
    with open(path, encoding="utf-8") as f:
        config = load_config(script_overrides(f.read(), _rel(path)))
    env = dict(config.worker.env_vars)
    assert config.trainer.device == "npu"
    assert int(env["HCCL_CONNECT_TIMEOUT"]) >= 1800 and int(env["HCCL_EXEC_TIMEOUT"]) >= 1800
    assert "libjemalloc" in env["LD_PRELOAD"]


def test_default_config_documents_every_key():
    """``config.yaml`` is the reference users read: it sets every user-settable key (unknown and auto keys are
    rejected by ``load_config``, see ``test_yaml_loads``)."""
    with open(os.path.join(ROOT, "config.yaml"), encoding="utf-8") as f:
        text = f.read()
    autos = auto_keys(PPOConfig)
    leaves = [k for k in valid_keys(PPOConfig) if k not in autos]
    # a YAML key at nesting depth d is indented 2*d spaces; walk the file and rebuild dotted names
    found, stack = set(), []
    for line in text.splitlines():
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_]*):", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [m.group(2)]
        found.add(".".join(stack))
    missing = [k for k in leaves if k not in found]
    assert not missing, f"config.yaml lacks these keys: {missing}"


def test_default_config_values(monkeypatch):
    """The documented recipe: EasyR1's geo3k GRPO setup on 8 GPUs."""
    monkeypatch.chdir(ROOT)
    config = load_config(["config=config.yaml"])
    assert config.worker.actor.model.model_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert (config.data.train_files, config.data.val_files) == ("hiyouga/geometry3k@train", "hiyouga/geometry3k@test")
    assert (config.data.max_prompt_length, config.data.max_response_length) == (2048, 2048)
    assert (config.data.rollout_batch_size, config.worker.actor.global_batch_size, config.worker.rollout.n) == (512, 128, 5)
    assert config.world_size == 8
    assert (config.algorithm.kl_penalty, config.algorithm.kl_coef) == ("low_var_kl", 1e-2)
    assert (config.worker.actor.clip_ratio_low, config.worker.actor.clip_ratio_high) == (0.2, 0.28)
