"""Running a command again (docs/errors.md C63-C67, K05, X06, M13): a resumed run must train as the run it continues
(a changed config is refused naming the keys), a finished run exits 0 without work, val_only needs validation data,
all unknown keys of a file are named at once, an online dashboard needs its login; without Ray (the pre-flight only).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from easyrl.config import load_config, to_dict
from easyrl.config.rerun import alters_training, training_changes
from easyrl.trainer.checkpoint import TRAINER_STATE, commit_checkpoint
from easyrl.trainer.run_folder import RunFinished, check_run_folder

REPO = Path(__file__).resolve().parents[1]
DEMO = f"config={REPO / 'examples/configs/cpu_demo.yaml'}"


def _config(tmp_path: Path, *overrides: str):
    return load_config([DEMO, "worker.actor.model.model_path=m", f"trainer.runs_root={tmp_path}", *overrides])


def _finished_run(config, step: int = 2) -> None:
    """A run folder as ``RayPPOTrainer.fit`` leaves it: ``config.yaml`` and a checkpoint at ``step``."""
    os.makedirs(config.trainer.run_dir, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(config), os.path.join(config.trainer.run_dir, "config.yaml"))
    commit_checkpoint(config.trainer.save_checkpoint_path, step, lambda tmp: Path(tmp, TRAINER_STATE).write_text("s"))


def test_which_keys_alter_training():
    for key in ("data.train_files", "worker.actor.model.model_path", "algorithm.adv_estimator", "data.seed",
                "worker.actor.optim.lr", "data.rollout_batch_size", "data.max_response_length", "worker.rollout.n",
                "worker.rollout.seed", "worker.reward.reward_function_kwargs", "trainer.critic_warmup"):
        assert alters_training(key), key
    for key in ("trainer.logger", "trainer.experiment_name", "trainer.runs_root", "trainer.val_freq",
                "trainer.save_freq", "trainer.max_steps", "trainer.wandb_tags", "data.val_files",
                "worker.rollout.val_override_config",
                "worker.actor.micro_batch_size_per_device_for_update", "worker.actor.offload.offload_params",
                "worker.rollout.gpu_memory_utilization", "trainer.resume_mode"):
        assert not alters_training(key), key


def test_training_changes_compares_free_dicts_whole_and_skips_keys_one_side_lacks():
    old = {"data": {"seed": 1, "val_files": "a"}, "worker": {"reward": {"reward_function_kwargs": {"w": 1}}},
           "trainer": {"logger": ["console"]}}
    new = {"data": {"seed": 2, "val_files": "b", "new_key": 3}, "worker": {"reward": {"reward_function_kwargs": {}}},
           "trainer": {"logger": ["jsonl"]}}
    assert training_changes(old, new, ("worker.reward.reward_function_kwargs",)) == [
        ("data.seed", 1, 2), ("worker.reward.reward_function_kwargs", {"w": 1}, {})]


def test_resume_with_a_changed_config_is_refused_naming_the_keys(tmp_path, expect_user_error):  # K05
    _finished_run(_config(tmp_path, "trainer.max_steps=5"))
    changed = _config(tmp_path, "trainer.max_steps=5", "worker.actor.optim.lr=2e-6", "data.seed=7",
                      "trainer.logger=[console]", "trainer.val_freq=3")  # the last two do not alter training
    line = expect_user_error(lambda: check_run_folder(changed.trainer, to_dict(changed), 5), "run",
                             "worker.actor.optim.lr: 0.001 -> 2e-06", "data.seed: 1 -> 7", "step 2",
                             "trainer.experiment_name", "trainer.resume_mode=force")
    assert "trainer.logger" not in line and "trainer.val_freq" not in line


def test_resume_with_another_sequence_parallel_degree(tmp_path):  # K21
    """worker.actor.ulysses_size lays a step out over the devices and trains the same samples with the same loss: a
    resume with another degree continues the run (was: refused as a change of training, K05)."""
    config = _config(tmp_path, "trainer.max_steps=5")
    _finished_run(config)
    again = _config(tmp_path, "trainer.max_steps=5", "worker.actor.ulysses_size=2", "worker.actor.padding_free=true")
    assert check_run_folder(again.trainer, to_dict(again), 5) == os.path.join(config.trainer.run_dir, "global_step_2")


def test_force_and_unchanged_configs_resume(tmp_path):
    config = _config(tmp_path, "trainer.max_steps=5")
    _finished_run(config)
    checkpoint = os.path.join(config.trainer.run_dir, "global_step_2")
    same = _config(tmp_path, "trainer.max_steps=5", "trainer.logger=[console]", "trainer.val_freq=3")
    assert check_run_folder(same.trainer, to_dict(same), 5) == checkpoint
    forced = _config(tmp_path, "trainer.max_steps=5", "worker.actor.optim.lr=2e-6", "trainer.resume_mode=force")
    assert check_run_folder(forced.trainer, to_dict(forced), 5) == checkpoint


def test_resume_mode_disable_refuses_a_folder_with_checkpoints(tmp_path, expect_user_error):
    config = _config(tmp_path)
    _finished_run(config)
    again = _config(tmp_path, "trainer.resume_mode=disable")
    expect_user_error(lambda: check_run_folder(again.trainer, to_dict(again), 2), "run", "trainer.resume_mode=disable")


def test_finished_run_is_said_plainly(tmp_path):
    config = _config(tmp_path)
    _finished_run(config)
    with pytest.raises(RunFinished, match=r"is finished: .*global_step_2 is at step 2 of 2.*trainer.max_steps"):
        check_run_folder(config.trainer, to_dict(config), 2)


def test_finished_run_exits_0_without_work(tmp_path, tiny_model_path, e2e_args, capsys):  # X06
    """The real command on a finished run: exit status 0, one line saying so, no Ray, nothing written."""
    import ray

    from easyrl.trainer.__main__ import main

    ray.shutdown()  # the session's shared Ray (conftest's local_ray): the command must start none of its own
    args = e2e_args("qwen2_5", tmp_path)
    _finished_run(load_config(args))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "is finished" in out and "global_step_2" in out
    assert not ray.is_initialized()
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # no export, no metrics, no new config


def test_unknown_keys_of_a_file_are_named_at_once(tmp_path, expect_user_error):  # C63
    path = tmp_path / "typos.yaml"
    path.write_text("data:\n  rollout_bach_size: 4\n  max_promt_length: 8\ntrainer:\n  max_step: 3\n")
    expect_user_error(lambda: load_config([f"config={path}"]), "config", "3 unknown config keys", str(path),
                      "'data.rollout_bach_size' (did you mean: data.rollout_batch_size",
                      "'data.max_promt_length' (did you mean: data.max_prompt_length",
                      "'trainer.max_step' (did you mean: trainer.max_steps")


def test_val_only_without_val_files(tmp_path, expect_user_error):  # C64
    expect_user_error(lambda: _config(tmp_path, "trainer.val_only=true", "data.val_files=null"), "config",
                      "trainer.val_only=true", "data.val_files")


def test_resume_path_without_load_checkpoint_path(tmp_path, expect_user_error):  # C65
    expect_user_error(lambda: _config(tmp_path, "trainer.resume_mode=resume_path"), "config",
                      "trainer.resume_mode=resume_path", "trainer.load_checkpoint_path")


def test_wandb_online_without_login(tmp_path, monkeypatch, expect_user_error):  # C66
    from easyrl.trainer.loggers import check_logger_credentials

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    config = _config(tmp_path, "trainer.logger=[console,wandb]")
    expect_user_error(lambda: check_logger_credentials(config.trainer), "config", "wandb", "WANDB_API_KEY",
                      "WANDB_MODE=offline")
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_logger_credentials(config.trainer)
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    check_logger_credentials(config.trainer)


def test_training_without_train_files(tmp_path, expect_user_error):  # C67
    from easyrl.trainer.preflight import prepare

    config = _config(tmp_path, "data.train_files=null")
    expect_user_error(lambda: prepare(config), "config", "data.train_files", "easyrl eval")


def test_eval_of_a_model_that_is_not_a_folder(tmp_path, expect_user_error):  # M13
    from easyrl.trainer.evaluation import evaluate_model

    config = _config(tmp_path, "trainer.val_only=true")
    expect_user_error(lambda: evaluate_model(config, str(tmp_path / "nowhere")), "model",
                      f"model={tmp_path / 'nowhere'}", "global_step_N")


def test_val_only_routes_the_training_command_to_eval(tmp_path, capsys):
    """``python -m easyrl.trainer ... trainer.val_only=true`` runs the eval command (here up to its model check, with
    ``trainer.load_checkpoint_path`` as the model), not a training run that would resume and train on."""
    from easyrl.trainer.__main__ import main

    missing = tmp_path / "global_step_3"
    status = main([DEMO, "worker.actor.model.model_path=m", f"trainer.runs_root={tmp_path}", "trainer.val_only=true",
                   f"trainer.load_checkpoint_path={missing}"])
    assert status == 2
    assert f"easyrl: model error: model={missing} is not a folder" in capsys.readouterr().err


def test_eval_with_model_needs_no_model_path_in_the_config(tmp_path, monkeypatch):
    """The example of docs/commands.md, ``easyrl eval config=examples/configs/cpu_demo.yaml model=FOLDER``: the demo
    config has no ``model_path``, so ``model=`` applies before the config's checks (it once exited 2, "model_path is
    not set")."""
    from easyrl.trainer import evaluation

    seen = {}
    monkeypatch.setattr(evaluation, "evaluate", lambda config, step, worker_cls: (
        seen.setdefault("model", config.worker.actor.model.model_path) and ({}, str(tmp_path))))
    evaluation.evaluate_command([DEMO, f"model={tmp_path}", f"trainer.runs_root={tmp_path}"])
    assert seen["model"] == str(tmp_path)
