"""Shared pytest fixtures (fixtures only)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def collective_contract() -> None:
    """Every multi-rank run of the suite (in-process trainers and ``python -m easyrl.trainer`` alike) checks that its
    ranks issue the same collectives, call by call (``easyrl.workers.collectives``): what NCCL/HCCL would hang on
    fails the test naming the call."""
    os.environ["EASYRL_CHECK_COLLECTIVES"] = "1"


@pytest.fixture(scope="session")
def tiny_model_path() -> Callable[[str], Path]:
    """Factory ``tiny_model_path(arch) -> Path`` of a tiny random-weight model (see ``easyrl.testing.tiny``).

    Models are built into the shared cache ``$EASYRL_CACHE/tiny_models/<arch>`` (default ``~/.cache/easyrl``), once
    per cache (later sessions reuse them) and at most once per test session.
    """
    from easyrl.testing.tiny import build_tiny_model

    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_model(arch)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def geo3k_sample_dir() -> Path:
    """Folder of the small geometry3k sample shipped in the repo (``examples/data/geometry3k_sample``)."""
    path = REPO_ROOT / "examples" / "data" / "geometry3k_sample"
    if not path.is_dir():
        pytest.fail(f"{path} is missing: it ships with the repository (restore it with git)")
    return path


@pytest.fixture(scope="session")
def e2e_args(tiny_model_path):
    """Factory ``e2e_args(arch, runs_root, *overrides) -> list[str]``: the command-line words of the CPU demo config
    with a tiny model of ``arch``, the Geometry3K sample as train and validation data, the test reward that varies
    between random responses (``tests/reward_functions/letters.py``), runs under ``runs_root``, then ``overrides``
    (later wins); for ``load_config`` or ``python -m easyrl.trainer``."""

    def build(arch: str, runs_root: Path, *overrides: str) -> list[str]:
        sample = REPO_ROOT / "examples" / "data" / "geometry3k_sample"
        return [
            f"config={REPO_ROOT / 'examples/configs/cpu_demo.yaml'}",
            f"worker.actor.model.model_path={tiny_model_path(arch)}",
            f"data.train_files={sample}",
            f"data.val_files={sample}",
            f"data.format_prompt={REPO_ROOT / 'examples/format_prompt/math.jinja'}",
            f"worker.reward.reward_function={REPO_ROOT / 'tests/reward_functions/letters.py'}:compute_score",
            "worker.reward.reward_function_kwargs={}",
            f"trainer.runs_root={runs_root}",
            *overrides,
        ]

    return build


@pytest.fixture(scope="session")
def e2e_config(e2e_args):
    """Factory ``e2e_config(arch, runs_root, *overrides) -> PPOConfig``: ``load_config(e2e_args(...))``."""
    from easyrl.config import load_config

    def build(arch: str, runs_root: Path, *overrides: str):
        return load_config(e2e_args(arch, runs_root, *overrides))

    return build


@pytest.fixture(scope="session")
def e2e_text_config(e2e_config):
    """Factory ``e2e_text_config(runs_root, *overrides) -> PPOConfig``: ``e2e_config`` with the tiny text model
    (``qwen2_5``) for short runs: no validation, responses of at most 16 tokens, images dropped, and vLLM's log-probs
    kept (``rollout/log_prob_diff_max``, the vLLM/actor parity); then ``overrides`` (later wins)."""

    def build(runs_root: Path, *overrides: str):
        return e2e_config(
            "qwen2_5", runs_root,
            "data.val_files=null",
            "data.max_response_length=16",
            "worker.rollout.limit_images=0",
            "worker.rollout.calculate_log_probs=true",
            *overrides,
        )

    return build


@pytest.fixture(scope="session")
def local_ray() -> Iterator[Callable[[], None]]:
    """``local_ray()`` starts Ray on 2 CPUs (no dashboard) unless it is running with both CPUs free: one Ray serves
    all the e2e tests of a session (``ray.init`` costs seconds on 2 cores each time). A test that needs a Ray of its
    own (a cluster of two nodes, commands that start their own) calls ``ray.shutdown()`` first; the next
    ``local_ray()`` starts it again. One whose CPUs a failed test left held (workers never shut down) is restarted.
    Shut down at the end of the session."""
    import time

    import ray

    def start() -> None:
        if ray.is_initialized():
            deadline = time.monotonic() + 10  # killed workers give their CPUs back within a moment
            while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            if ray.available_resources().get("CPU", 0) >= 2:
                return
            ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False)

    yield start
    ray.shutdown()


@pytest.fixture(scope="session")
def trainer_on_ray(local_ray) -> Callable:
    """Context-manager factory: ``with trainer_on_ray(config, worker_cls=None) as trainer:`` builds the trainer on the
    session's Ray (``local_ray``; ``easyrl.trainer.__main__.build_trainer``; ``worker_cls`` e.g.
    ``easyrl.testing.worker.InspectableWorker``); on leaving the block it is closed (``RayPPOTrainer.close``: its
    streams, tools, endpoint and workers), or, when the block
    raised, Ray itself (which ends them)."""

    @contextmanager
    def run(config, worker_cls=None) -> Iterator:
        import ray

        from easyrl.trainer.__main__ import build_trainer

        local_ray()
        try:
            trainer = build_trainer(config, worker_cls)
            yield trainer
        except BaseException:
            ray.shutdown()
            raise
        trainer.close()

    return run


@pytest.fixture
def expect_user_error(capsys):
    """``expect_user_error(fn, kind, *culprits) -> line``: run ``fn`` through the CLI's error handler
    (``easyrl.errors.run_cli``, as ``python -m easyrl.trainer`` does) and check the one rule of docs/errors.md: exit
    status 2, one line ``easyrl: <kind> error: ...`` naming every culprit, and no traceback."""
    from easyrl.errors import run_cli

    def check(fn: Callable[[], object], kind: str, *culprits: str) -> str:
        capsys.readouterr()  # drop earlier output
        status = run_cli(lambda: fn() and 0)
        err = capsys.readouterr().err
        assert status == 2, f"exit status {status}, stderr: {err}"
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("easyrl:")]
        assert len(lines) == 1 and lines[0].startswith(f"easyrl: {kind} error: "), err
        for culprit in culprits:
            assert culprit in lines[0], f"{culprit!r} not named in: {lines[0]}"
        return lines[0]

    return check


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo process group for the module (FSDP2 needs one even on a single process)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def write_module_durations(terminalreporter, top: int = 25) -> None:
    """The suite's time by test module (set-up, calls and tear-down of its tests, module fixtures included), the
    ``top`` slowest first with their share of the whole, so a CI log shows where the minutes go."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                module = report.nodeid.split("::")[0]
                seconds[module] = seconds.get(module, 0.0) + report.duration
    total = sum(seconds.values())
    if not total:
        return
    terminalreporter.write_sep("=", f"time by module (top {min(top, len(seconds))} of {len(seconds)}, "
                                    f"{total / 60:.1f} min in all)")
    for module, value in sorted(seconds.items(), key=lambda item: -item[1])[:top]:
        terminalreporter.write_line(f"{value:8.1f} s {value / total:6.1%}  {module}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line naming the vLLM/torch line this run tested, e.g. ``vllm 0.32.0 / torch 2.13.0: 180 passed, 2 skipped``
    (``make test`` runs the suite on the main lock and on compat/vllm-0.23, and repeats both lines at its end from the
    file named by ``EASYRL_TEST_SUMMARY``, when set)."""
    import os
    from importlib import metadata

    import torch

    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller reports the run
        return

    from easyrl.workers.vllm_compat import VLLM_DISTRIBUTIONS

    vllm = "none"
    for name in VLLM_DISTRIBUTIONS:
        try:
            vllm = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            continue
    counts = ", ".join(f"{len(terminalreporter.stats[key])} {key}" for key in
                       ("passed", "failed", "error", "skipped") if terminalreporter.stats.get(key))
    part = f" ({os.environ['EASYRL_TEST_PART']})" if os.environ.get("EASYRL_TEST_PART") else ""
    line = f"vllm {vllm} / torch {torch.__version__.split('+')[0]}{part}: {counts or 'no tests ran'}"
    write_module_durations(terminalreporter)
    terminalreporter.write_line(line)
    if os.environ.get("EASYRL_TEST_SUMMARY"):
        with open(os.environ["EASYRL_TEST_SUMMARY"], "a") as f:
            f.write(line + "\n")
