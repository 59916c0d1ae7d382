"""``easyrl.envvars``: the one reader of each environment variable easyrl interprets, the switch words, the readers'
users (no second parse anywhere), the pre-flight on every config the suite uses, and verl's keys in the unknown-key
error (``easyrl.config.verl_keys``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from easyrl import envvars
from easyrl.config import PPOConfig, load_config, valid_keys
from easyrl.errors import ConfigError
from tests.test_errors_env import _config

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "easyrl"


@pytest.mark.parametrize("word, on", [(w, True) for w in ("1", "true", "TRUE", "Yes", "on", " On ")]
                         + [(w, False) for w in ("0", "false", "False", "NO", "off", "", "  ")])
def test_switch_words_in_any_case(word, on):
    assert envvars.parse_switch("EASYRL_X", word) is on


@pytest.mark.parametrize("word", ["2", "enable", "fasle", "-1", "y"])
def test_other_switch_words_are_refused(word):
    with pytest.raises(envvars.EnvValueError, match=re.escape(f"EASYRL_X={word!r} is not a switch (")):
        envvars.parse_switch("EASYRL_X", word)


def test_false_reads_as_off_for_every_switch(monkeypatch):
    """Before: ``EASYRL_CHECK_COLLECTIVES=false`` turned the contract on, ``EASYRL_VERBOSE=off`` kept every log."""
    from easyrl import quiet
    from easyrl.workers import collectives
    from easyrl.workers.group import worker_runtime_env

    monkeypatch.setenv("EASYRL_CHECK_COLLECTIVES", "false")
    monkeypatch.setenv("EASYRL_VERBOSE", "off")
    assert not collectives.contract_on(False) and not quiet.verbose()
    assert "EASYRL_CHECK_COLLECTIVES" not in worker_runtime_env("cpu", 1, {})  # the parsed value is what is forwarded
    monkeypatch.setenv("EASYRL_CHECK_COLLECTIVES", "On")
    assert collectives.contract_on(False) and worker_runtime_env("cpu", 1, {})["EASYRL_CHECK_COLLECTIVES"] == "1"


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "1e400", "fast"])
def test_peak_must_be_a_positive_finite_number(value):
    with pytest.raises(envvars.EnvValueError, match="EASYRL_PEAK_TFLOPS"):
        envvars.peak_tflops({"EASYRL_PEAK_TFLOPS": value})


def test_numbers_read():
    assert envvars.peak_tflops({"EASYRL_PEAK_TFLOPS": " 2.5 "}) == 2.5 and envvars.peak_tflops({}) is None
    assert envvars.omp_threads({"OMP_NUM_THREADS": "4"}) == 4 and envvars.omp_threads({"OMP_NUM_THREADS": ""}) is None
    assert envvars.cpu_kvcache_gib({"VLLM_CPU_KVCACHE_SPACE": "0"}) == 0  # vLLM's default
    for name, value in (("OMP_NUM_THREADS", "0"), ("OMP_NUM_THREADS", "2.5"), ("VLLM_CPU_KVCACHE_SPACE", "1.5")):
        with pytest.raises(envvars.EnvValueError, match=f"{name}={value!r} is not a whole number"):
            envvars.READERS[name][0]({name: value})
    assert envvars.log_level({"EASYRL_LOG_LEVEL": "warning"}) == "WARNING" and envvars.log_level({}) == "INFO"


def test_a_worker_number_is_read_in_worker_env_vars():
    with pytest.raises(envvars.EnvValueError, match=re.escape("OMP_NUM_THREADS='four' is not a whole number >= 1 "
                                                              "(threads per worker process), in worker.env_vars")):
        envvars.check_environment(_config("worker.env_vars={OMP_NUM_THREADS: four}"), {})


def test_no_override_without_a_variable_and_none_of_the_cpu_cache_on_gpus():
    assert envvars.check_environment(_config(), {}) == []
    config = _config("trainer.device=cuda", "trainer.check_collectives=true")
    assert envvars.check_environment(config, {"VLLM_CPU_KVCACHE_SPACE": "4", "EASYRL_CHECK_COLLECTIVES": "1"}) == []


def test_the_command_environment_may_hold_an_openmp_list():
    """easyrl sets the workers' ``OMP_NUM_THREADS`` itself: the command's own (an OpenMP list) is not refused."""
    assert envvars.check_environment(_config(), {"OMP_NUM_THREADS": "4,2"}) == []


def test_replaced_restores_what_was_there():
    environ = {"A": "1"}
    with envvars.replaced(environ, "A", None):
        assert "A" not in environ
    with envvars.replaced(environ, "A", "2"), envvars.replaced(environ, "B", "3"):
        assert environ == {"A": "2", "B": "3"}
    assert environ == {"A": "1"}


def _reads(root: Path) -> list[str]:
    """The lines of the package under ``root`` (but ``envvars.py``) that read an interpreted variable of
    :data:`easyrl.envvars.READERS` from the environment, by its name or a constant naming it."""
    names = "|".join(envvars.READERS)
    constants = [name for name, value in vars(envvars).items() if isinstance(value, str) and value in envvars.READERS]
    ref = rf"""(?:["'](?:{names})["']|(?:\w+\.)?(?:{'|'.join(constants + ['ENV', 'PEAK_ENV', 'VERBOSE_ENV'])})\b)"""
    read = re.compile(rf"(?:environ\.get|getenv|environ\.setdefault|environ\.pop)\(\s*{ref}"
                      rf"|environ\[\s*{ref}\s*\](?!\s*=[^=])|{ref}\s+(?:not\s+)?in\s+(?:os\.)?environ\b")
    return [f"{path.relative_to(root.parent)}:{number}: {line.strip()}"
            for path in sorted(root.rglob("*.py")) if path != root / "envvars.py"
            for number, line in enumerate(path.read_text().splitlines(), 1) if read.search(line)]


def test_every_interpreted_variable_is_read_only_by_envvars():
    """No module of easyrl but ``easyrl/envvars.py`` reads an interpreted variable from the environment: each has one
    reader, and the pre-flight reads them all before Ray."""
    assert _reads(PACKAGE) == []


def _suite_configs() -> dict[str, list[str]]:
    """Every config the suite and the examples use: each YAML under examples/, config.yaml, and the launch scripts'
    ``worker.env_vars`` (the NPU recipe's HCCL timeouts and jemalloc)."""
    configs = {str(p.relative_to(REPO)): [f"config={p}"] for p in sorted((REPO / "examples").rglob("*.yaml"))}
    configs["config.yaml"] = [f"config={REPO / 'config.yaml'}"]
    configs["npu env_vars"] = ["worker.env_vars={HCCL_CONNECT_TIMEOUT: '1800', HCCL_EXEC_TIMEOUT: '1800', "
                               "LD_PRELOAD: /usr/lib/aarch64-linux-gnu/libjemalloc.so.2}"]
    return configs


def _suite_environment() -> dict[str, str]:
    """The environment the suite and its workers run in: the conftest's contract switch, the commands' debug
    switch, and what easyrl itself gives every worker (in-process vLLM, quiet logs, threads, device switches)."""
    from easyrl.workers.group import worker_runtime_env
    from easyrl.workers.vllm_compat import IN_PROCESS_ENGINE_ENV

    env = {"EASYRL_CHECK_COLLECTIVES": "1", "EASYRL_DEBUG": "0", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline",
           "EASYRL_LOG_LEVEL": "INFO", **IN_PROCESS_ENGINE_ENV}
    for device in ("cpu", "cuda", "npu"):
        env.update(worker_runtime_env(device, 2, {}))
    return env


@pytest.mark.parametrize("name", sorted(_suite_configs()))
def test_the_pre_flight_accepts_every_config_the_suite_uses(name):
    config = _config(*_suite_configs()[name])
    envvars.check_environment(config, {})
    envvars.check_environment(config, _suite_environment())


def test_the_pre_flight_accepts_the_worker_environment_it_builds():
    """What easyrl gives the workers, read back as ``worker.env_vars``, is accepted too (no value it writes is one
    it would refuse)."""
    env = {k: v for k, v in _suite_environment().items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING",)}
    config = _config()
    config.worker.env_vars = env
    envvars.check_environment(config, env)


# ------------------------------------------------------------------------------------------------------------------
# verl's keys (easyrl.config.verl_keys)


def test_every_verl_key_is_in_the_migration_table_and_names_real_easyrl_keys():
    from easyrl.config.verl_keys import VERL_KEYS

    table = (REPO / "docs" / "migrating.md").read_text()
    valid = valid_keys(PPOConfig)
    for key, hint in VERL_KEYS.items():
        assert f"`{key}" in table, f"{key} is not in docs/migrating.md"
        named = re.findall(r"\b(?:data|algorithm|worker|trainer)\.[a-z_]+(?:\.[a-z_]+)*", hint)
        assert all(name in valid for name in named), (key, [name for name in named if name not in valid])


@pytest.mark.parametrize("word, says", [
    ("async_training.staleness_threshold=0.5", "easyrl has it as trainer.max_staleness"),
    ("rollout.n_gpus_per_node=2", "easyrl has it as worker.rollout.n_gpus_per_node"),
    ("actor_rollout_ref.hybrid_engine=false", "trainer.rollout_mode=one_step_off or async"),
    ("actor_rollout_ref.rollout.mode=async", "easyrl has none: verl's sync/async picks its engine API"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "easyrl has it as worker.actor.ulysses_size"),
    ("async_training.checkpoint_engine.enable=true", "'async_training.checkpoint_engine' (from the command line): "
     "verl's key; easyrl has none"),
])
def test_a_verl_key_is_answered_with_the_easyrl_key(word, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config([word])


def test_other_keys_of_a_verl_section_point_to_the_migration_page_and_typos_keep_their_hint():
    with pytest.raises(ConfigError, match=r"2 unknown config keys .*'actor_rollout_ref.rollout.mode' \(verl's key.*"
                       r"'actor_rollout_ref' \(actor_rollout_ref.model.path, a key of verl's config"):
        load_config(["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.model.path=x"])
    with pytest.raises(ConfigError, match=re.escape("Unknown config key 'data.rollout_bach_size' (from the command "
                                                    "line). Did you mean: data.rollout_batch_size")):
        load_config(["data.rollout_bach_size=4"])
