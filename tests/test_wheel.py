"""easyrl as a user installs it: ``uv build`` of the working tree makes an sdist and a wheel (the wheel from the sdist);
the wheel holds every file of ``easyrl/`` (the modules and the data the package reads at run time: pyproject.toml's
package-data) and nothing else; installed into a fresh virtual environment beside the locked stack, it runs
``easyrl --help``, ``easyrl --version``, ``easyrl simulate`` of config.yaml (the model's shape from the wheel's
``easyrl/model_configs``) and a config load, from a folder outside the checkout. No network: the build uses the
locked setuptools (``--no-build-isolation``), the install takes no dependencies (``--no-deps``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
UV = [shutil.which("uv")] if shutil.which("uv") else ["python3", "-m", "uv"]  # `make setup` installs one of them


def _run(argv: list, cwd: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def source_files() -> list[str]:
    """The working tree as git sees it: tracked and untracked files, less the ignored ones."""
    out = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], REPO).stdout
    return sorted(name for name in set(out.split("\0")) if name and (REPO / name).is_file())


def wheel_problems(names: list[str], package_files: list[str]) -> list[str]:
    """What is wrong with a wheel holding ``names``, for a package whose files are ``package_files`` (paths under
    ``easyrl/``): each package file it lacks, each other file outside its ``.dist-info``, each cache or bytecode."""
    have = {name for name in names if not name.split("/")[0].endswith(".dist-info")}
    problems = [f"missing {name}" for name in sorted(set(package_files) - have)]
    problems += [f"not of the package: {name}" for name in sorted(have - set(package_files))]
    problems += [f"a cache: {name}" for name in names if "__pycache__" in name or name.endswith((".pyc", ".pyo"))]
    return problems


def test_wheel_problems_names_what_is_missing_or_extra():
    package = ["easyrl/__init__.py", "easyrl/model_configs/A/config.json"]
    assert wheel_problems(package + ["easyrl-0.1.0.dist-info/METADATA"], package) == []
    assert wheel_problems(["easyrl/__init__.py", "tests/test_x.py", "easyrl/__pycache__/x.pyc"], package) == [
        "missing easyrl/model_configs/A/config.json", "not of the package: easyrl/__pycache__/x.pyc",
        "not of the package: tests/test_x.py", "a cache: easyrl/__pycache__/x.pyc"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A copy of the working tree (so that the build's egg-info stays out of the checkout), ``uv build`` of it."""
    if not (REPO / ".git").exists():  # a copy without git (the Dockerfile's image) has no working tree to list
        pytest.skip("not a git checkout")
    root = tmp_path_factory.mktemp("wheel")
    src, dist = root / "src", root / "dist"
    files = source_files()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    _run([*UV, "build", "--offline", "--no-build-isolation", "--python", sys.executable, "--out-dir", dist], src,
         timeout=300)
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert [w.name for w in wheels] == [f"easyrl-{VERSION}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"easyrl-{VERSION}.tar.gz"]
    return {"root": root, "wheel": wheels[0], "sdist": sdists[0],
            "package_files": [name for name in files if name.startswith("easyrl/")]}


def test_the_wheel_holds_the_package_and_its_data_and_nothing_else(built):
    names = zipfile.ZipFile(built["wheel"]).namelist()
    assert wheel_problems(names, built["package_files"]) == []
    data = [name for name in built["package_files"] if not name.endswith(".py")]
    assert "easyrl/rewards/judge.jinja" in data and "easyrl/model_configs/Qwen2.5-VL-7B-Instruct/config.json" in data
    entry_points = zipfile.ZipFile(built["wheel"]).read(f"easyrl-{VERSION}.dist-info/entry_points.txt").decode()
    assert "easyrl = easyrl.cli:main" in entry_points


def test_the_sdist_holds_the_package_and_no_tests_or_caches(built):
    names = [name.split("/", 1)[1] for name in tarfile.open(built["sdist"]).getnames() if "/" in name]
    assert set(built["package_files"]) <= set(names)
    assert {"pyproject.toml", "README.md", "config.yaml"} <= set(names)
    assert [name for name in names if name.startswith("tests/") or "__pycache__" in name or name.endswith(".pyc")] == []


@pytest.fixture(scope="module")
def installed(built) -> dict:
    """A fresh virtual environment whose only easyrl is the wheel; the locked stack (torch, transformers, ...) is
    reached through a ``.pth`` line naming this interpreter's site-packages (a plain path: the ``.pth`` files there,
    the checkout's editable install among them, are not run)."""
    root = built["root"]
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], root)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip())
    stack = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "locked_stack.pth").write_text("".join(f"{path}\n" for path in stack))
    _run([*UV, "pip", "install", "--offline", "--no-deps", "--python", python, built["wheel"]], root)
    user = root / "user"  # a folder outside the checkout, holding only a config file
    user.mkdir()
    shutil.copy2(REPO / "config.yaml", user / "config.yaml")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1")
    return {"venv": venv, "python": python, "site": site, "user": user, "env": env}


def test_easyrl_help_and_version_from_the_wheel(installed):
    easyrl = installed["venv"] / "bin" / "easyrl"
    out = _run([easyrl, "--help"], installed["user"], installed["env"]).stdout
    assert out.startswith("usage: easyrl") and "simulate" in out
    assert _run([easyrl, "--version"], installed["user"], installed["env"]).stdout.strip() == f"easyrl {VERSION}"


def test_easyrl_simulate_of_config_yaml_from_the_wheel(installed):
    """config.yaml's model (Qwen2.5-VL-7B-Instruct) is found in the wheel's ``easyrl/model_configs``."""
    proc = _run([installed["venv"] / "bin" / "easyrl", "simulate", "config=config.yaml", "--estimate-only", "--json"],
                installed["user"], installed["env"], timeout=180)
    result = json.loads(proc.stdout)
    assert result["sides"]["trainer"]["fits"] is True, result


def test_a_config_loads_from_the_wheel_with_its_data(installed):
    """The package imported is the wheel's, not the checkout's; config.yaml loads; the judge's default prompt and the
    shipped model configurations are inside the installed package."""
    script = (
        "import json, easyrl\n"
        "from easyrl.config import load_config\n"
        "from easyrl.rewards.judge import DEFAULT_TEMPLATE, JudgePrompt\n"
        "from easyrl.simulate.phases import model_folder\n"
        "config = load_config(['config=config.yaml'])\n"
        "print(json.dumps({'package': easyrl.__file__, 'model_path': config.worker.actor.model.model_path,\n"
        "                  'template': str(DEFAULT_TEMPLATE), 'judge': JudgePrompt(None).path,\n"
        "                  'model_folder': model_folder(config.worker.actor.model.model_path)}))\n")
    proc = _run([installed["python"], "-c", script], installed["user"], installed["env"])
    out = json.loads(proc.stdout.splitlines()[-1])
    site = str(installed["site"])
    assert out["package"] == os.path.join(site, "easyrl", "__init__.py")
    assert out["model_path"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert out["judge"] == out["template"] == os.path.join(site, "easyrl", "rewards", "judge.jinja")
    assert out["model_folder"] == os.path.join(site, "easyrl", "model_configs", "Qwen2.5-VL-7B-Instruct")
