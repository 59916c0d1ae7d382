"""``easyrl simulate`` (easyrl/simulate): the simulated device catches what a real accelerator would refuse, naming
the call, and the command exits non-zero with the numbers for a config that cannot fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from easyrl.cli import COMMANDS
from easyrl.simulate.__main__ import main
from easyrl.simulate.fake_device import (
    DeviceCheckError,
    accelerator_standins,
    device_check,
    fake_tensors,
    fake_world,
)
from easyrl.sizing.devices import DEVICES

ROOT = Path(__file__).resolve().parents[1]


def planted_mix(weight: torch.Tensor) -> torch.Tensor:
    host = torch.ones(weight.shape)  # a host tensor reaching a device op: the bug
    return weight * host


def planted_collective() -> None:
    count = torch.ones(2)  # the token count left on the host: NCCL would refuse it
    dist.all_reduce(count)


def _simulated(run):
    with fake_world(0, 8), accelerator_standins(DEVICES["h100"]), fake_tensors("cuda"):
        weight = torch.empty(4, 4, device="cuda")
        with device_check("planted"):
            run(weight)


def test_host_device_mix_is_caught_naming_the_call():
    with pytest.raises(DeviceCheckError, match=r"phase 'planted': host/device mix at .*test_simulate.py:\d+ in "
                                               r"planted_mix: return weight \* host"):
        _simulated(planted_mix)


def test_collective_on_a_host_tensor_is_caught_naming_the_call():
    with pytest.raises(DeviceCheckError, match=r"host tensor in a collective at .*in planted_collective: "
                                               r"dist.all_reduce\(count\)"):
        _simulated(lambda weight: planted_collective())


def test_device_tensors_pass_and_data_dependent_code_runs(monkeypatch):
    # vLLM's import sets it; torch's NVML-based availability check would then count the simulated device
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

    def run(weight):
        mask = torch.tensor([[0, 1, 1], [1, 1, 0]]).to("cuda")  # the batch's mask, moved to the device
        assert mask.sum(-1).tolist() == [2, 2]  # real values: easyrl's packing code needs them
        assert mask.bool().nonzero().shape == (4, 2)
        count = torch.tensor([3], device="cuda")
        dist.all_reduce(count)
        assert (weight @ weight).device.type == "cuda"

    _simulated(run)


def test_thirty_b_moe_on_one_80gb_gpu_without_offload_exits_nonzero_with_the_numbers(capsys):
    code = main(["config=" + str(ROOT / "config.yaml"), "worker.actor.model.model_path=Qwen/Qwen3-VL-30B-A3B-Instruct",
                 "trainer.n_gpus_per_node=1", "--device", "h100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and not out["fits"]
    assert out["capacity_gib"] == pytest.approx(79.2)
    assert out["estimate"]["vllm_weights_gib"] == pytest.approx(57.9, abs=0.1)  # 31.07e9 bf16 parameters
    assert "worker.rollout.tensor_parallel_size" in out["problem"]


def _small_model(folder: Path) -> str:
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=False).save_pretrained(folder)
    return str(folder)


def test_every_phase_runs_on_a_small_model_and_the_shards_match_a_hand_count(tmp_path, capsys):
    from transformers import AutoConfig

    from easyrl.config import load_config
    from easyrl.simulate.phases import simulate
    from easyrl.sizing.anatomy import GIB, model_anatomy

    path = _small_model(tmp_path / "model")
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={path}",
                          "data.max_prompt_length=256", "data.max_response_length=256"])
    sim = simulate(config, DEVICES["h100"])
    phases = {p.name: p for p in sim.phases}
    assert list(phases) == ["load actor", "load reference", "old log-probs (forward)", "reference forward",
                            "weight sync gather", "checkpoint state dict", "export gather",
                            "actor update (fwd+bwd+AdamW)"]
    params = model_anatomy(AutoConfig.from_pretrained(path))[0]
    # after loading, rank 0 holds its float32 shard (the reference is offloaded to the host by config.yaml)
    assert phases["load actor"].resident_gib == pytest.approx(4 * params / 8 / GIB, rel=0.01)
    assert phases["load reference"].resident_gib == pytest.approx(phases["load actor"].resident_gib, rel=0.01)
    # rank 0 broadcasts the checkpoint tensor by tensor: the largest full float32 tensor on top of the shard
    assert phases["load actor"].peak_gib == pytest.approx((4 * params / 8 + 4 * 1024 * 256) / GIB, rel=0.01)
    assert all(p.peak_gib > 0 for p in sim.phases)


def _small_qwen3(folder: Path, classifier: bool = False) -> str:
    from transformers import Qwen3Config

    config = Qwen3Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=1024, num_labels=1, pad_token_id=0)
    config.architectures = ["Qwen3ForSequenceClassification" if classifier else "Qwen3ForCausalLM"]
    config.save_pretrained(folder)
    return str(folder)


def test_teacher_and_reward_model_are_simulated_with_their_worker_code(tmp_path):
    """Distillation's teacher (``FSDPPolicy`` with ``teacher_role_config``) and the reward model (``FSDPRewardModel``)
    are loaded and run as rank 0 on the simulated device; the reward model's resident shard (not offloaded here) is
    its parameters in bf16 / 8."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from easyrl.config import load_config
    from easyrl.simulate.phases import simulate
    from easyrl.sizing.anatomy import GIB

    actor, teacher = _small_model(tmp_path / "actor"), _small_qwen3(tmp_path / "teacher")
    rm = _small_qwen3(tmp_path / "rm", classifier=True)
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={actor}",
                          "data.max_prompt_length=128", "data.max_response_length=128", "algorithm.distill_coef=0.1",
                          f"worker.teacher.model.model_path={teacher}", f"worker.reward.reward_model.model_path={rm}",
                          "worker.reward.reward_model.offload.offload_params=false"])
    sim = simulate(config, DEVICES["h100"], log=lambda _: None, update=False)
    phases = {p.name: p for p in sim.phases}
    assert list(phases)[4:8] == ["load teacher", "teacher forward", "load reward model", "reward model forward"]
    with torch.device("meta"):
        rm_params = sum(p.numel() for p in AutoModelForSequenceClassification.from_config(
            AutoConfig.from_pretrained(rm)).parameters())
    grown = phases["load reward model"].resident_gib - phases["teacher forward"].resident_gib
    assert grown == pytest.approx(2 * rm_params / 8 / GIB, rel=0.05)
    assert phases["teacher forward"].peak_gib > phases["load teacher"].resident_gib


def test_every_teacher_of_several_is_loaded_and_run(tmp_path):
    """Several teachers (``worker.teachers``): all loaded first, as the workers build them, then each one's forward;
    the resident one's shard stays (bf16 / 8), the offloaded one's does not."""
    from easyrl.config import load_config
    from easyrl.simulate.phases import simulate
    from easyrl.sizing.anatomy import GIB

    actor, big, small = (_small_qwen3(tmp_path / name) for name in ("actor", "big", "small"))
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={actor}",
                          "data.max_prompt_length=128", "data.max_response_length=128",
                          "algorithm.adv_estimator=on_policy_distill", f"worker.teachers.big.model.model_path={big}",
                          "worker.teachers.big.offload.offload_params=false", "worker.teachers.big.default=true",
                          f"worker.teachers.small.model.model_path={small}", "worker.teachers.small.data_sources=[x]"])
    sim = simulate(config, DEVICES["h100"], log=lambda _: None, update=False)
    names = [p.name for p in sim.phases]
    teachers = ["load teacher big", "load teacher small", "teacher big forward", "teacher small forward"]
    assert names[names.index("load teacher big"):][:4] == teachers
    phases = {p.name: p for p in sim.phases}
    with torch.device("meta"):
        from transformers import AutoConfig, AutoModelForCausalLM

        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(big)).parameters())
    before = phases[names[names.index("load teacher big") - 1]].resident_gib
    assert phases["load teacher big"].resident_gib - before == pytest.approx(2 * params / 8 / GIB, rel=0.05)
    assert phases["load teacher small"].resident_gib == pytest.approx(phases["load teacher big"].resident_gib,
                                                                      rel=0.01)


def test_the_judge_engine_is_held_beside_every_phase():
    """The judge's vLLM engine has no sleep mode: a phase that fits alone but not beside the judge's claim fails,
    and judge weights larger than its claim fail before any phase (the estimate's check, as in the pre-flight)."""
    from easyrl.errors import ConfigError
    from easyrl.simulate import report
    from easyrl.simulate.phases import PhaseResult, Simulation
    from easyrl.sizing.estimate import JUDGE, MemoryEstimate, check_memory

    estimate = MemoryEstimate(capacity_gib=79.2, vllm_weights_gib=1.0, tensor_parallel_size=1, vllm_claim_gib=40.0)
    sim = Simulation([PhaseResult("actor update (fwd+bwd+AdamW)", 60.0, 0.0, 1.0)])
    assert report.verdict(sim, estimate, None) is None
    sim.beside[JUDGE] = 19.8
    assert "actor update" in report.verdict(sim, estimate, None) and "judge vLLM" in report.verdict(sim, estimate,
                                                                                                    None)
    judged = MemoryEstimate(79.2, 1.0, 1, 40.0, rollout={JUDGE: 7.9}, training={JUDGE: 7.9}, judge_weights_gib=15.2)
    with pytest.raises(ConfigError, match="judge's vLLM weights .*worker.reward.judge.gpu_memory_utilization"):
        check_memory(judged)
    judged.judge_weights_gib = 7.0
    check_memory(judged)


def test_lora_simulates(tmp_path):
    """peft wraps the meta model with fake tensors switched off (``phases.simulated_rank``): on fake tensors
    its ``Module.to`` swap refused them ("Couldn't swap Linear.weight"), and the LoRA recipe was an expected failure."""
    from easyrl.config import load_config
    from easyrl.simulate.phases import simulate

    path = _small_model(tmp_path / "model")
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={path}",
                          "data.max_prompt_length=128", "data.max_response_length=128",
                          "worker.actor.model.lora.rank=8"])
    phases = [p.name for p in simulate(config, DEVICES["h100"], log=lambda _: None).phases]
    assert phases == ["load actor", "old log-probs (forward)", "weight sync gather", "checkpoint state dict",
                      "export gather", "actor update (fwd+bwd+AdamW)"]  # no reference: the base is the reference


def test_help_answers_without_importing_torch_or_transformers():
    """``easyrl simulate --help`` took ~30 s: it imported torch (the device table sat beside the fake tensors)."""
    code = ("import sys\nfrom easyrl.cli import main\ntry:\n    main(['simulate', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint('heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
    assert "--device {910b,a100-40,a100-80,h100,h200}" in out and out.strip().endswith("heavy: []"), out


def test_the_verdict_names_every_phase_that_does_not_fit_with_advice_for_it():
    """Two simulated phases over the device are both named (the verdict named the first), each with what shrinks
    the estimate's largest items for it: the actor's shards, not the (offloaded, 0 GiB) reference nor a micro-batch
    (activations 3 of 93 GiB). The table states the host memory the offloaded states need."""
    from easyrl.simulate import report
    from easyrl.simulate.phases import PhaseResult, Simulation
    from easyrl.sizing.estimate import MemoryEstimate

    estimate = MemoryEstimate(79.2, 1.0, 1, 40.0, rollout={"vLLM (gpu_memory_utilization)": 40.0, "actor params": 30.0,
                                                           "reference": 0.0},
                              training={"actor params": 30.0, "actor Adam states": 60.0,
                                        "activations (layers in backward)": 3.0}, host={"reference": 14.0})
    sim = Simulation([PhaseResult("load actor", 85.0, 30.0, 1.0), PhaseResult(
        "actor update (fwd+bwd+AdamW)", 93.0, float("nan"), 1.0), PhaseResult("export gather", 50.0, 30.0, 1.0)])
    problem = report.verdict(sim, estimate, None)
    assert "'load actor'" in problem and "'actor update (fwd+bwd+AdamW)'" in problem and "export" not in problem
    assert "worker.actor.offload.offload_params=true" in problem
    assert "micro_batch" not in problem and "worker.ref" not in problem
    table = report.table(sim, estimate, {"trainer": problem}, "h100", 8)
    assert "host memory per node for the offloaded states: 14.0 GiB" in table


def test_the_docs_list_the_command():
    """The command lists (README, docs/commands.md) name every ``easyrl`` command; docs/simulate.md no longer calls
    it unwired."""
    for page, heading in (("README.md", "## Commands"), ("docs/commands.md", "# Commands")):
        commands = (ROOT / page).read_text().split(heading, 1)[1].split("```")[1]
        assert all(f"easyrl {name} " in commands for name in COMMANDS), (page, commands)
    assert "once the console script wires" not in (ROOT / "docs" / "simulate.md").read_text()


def test_a_split_config_reports_each_side_with_its_own_peak_and_verdict(tmp_path, capsys):
    """``trainer.rollout_mode=one_step_off`` with 2 rollout devices (the estimate only: the simulation runs the
    trainer's phases, as in tests above): the trainer's 8 devices hold no engine, the rollout devices its claim and
    the weights arriving (the small model whole, its bucket, and a layer: a few MiB)."""
    path = _small_model(tmp_path / "model")
    argv = ["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={path}", "data.val_files=null",
            "trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=2", "--estimate-only"]
    assert main(argv + ["--json"]) == 0
    sides = json.loads(capsys.readouterr().out)["sides"]
    rollout = sides["rollout"]
    assert (rollout["devices"], rollout["fits"], rollout["problem"]) == (2, True, None)
    assert 0 < rollout["peak_gib"] - 0.6 * 79.2 < 0.05
    assert sides["trainer"]["devices"] == 8 and sides["trainer"]["fits"] and sides["trainer"]["peak_gib"] < 1.0
    assert main(argv + ["worker.rollout.gpu_memory_utilization=0.2"]) == 0
    table = capsys.readouterr().out
    assert "trainer devices (8): peak 0." in table and "rollout devices (2): peak 15.8 GiB: fits" in table, table


def test_the_simulated_update_accumulates_over_the_worker_s_mini_batch_with_ulysses(tmp_path):
    """With ``ulysses_size=2`` on 4 devices the worker's mini-batch is ``global_batch_size * n / dp_size`` = 4 * 2 / 2
    = 4 samples per rank (``PPOConfig.mini_batch_samples``, what ``FSDPWorker.update_actor`` passes), two micro-batches
    of 2: the simulated later step takes two micro-batches' tokens, not the world size's one."""
    from easyrl.config import load_config
    from easyrl.simulate.phases import update_batches

    path = _small_model(tmp_path / "model")
    config = load_config(["config=" + str(ROOT / "config.yaml"), f"worker.actor.model.model_path={path}",
                          "data.max_prompt_length=64", "data.max_response_length=64", "trainer.n_gpus_per_node=4",
                          "worker.actor.ulysses_size=2", "data.rollout_batch_size=4", "worker.actor.global_batch_size=4",
                          "worker.rollout.n=2", "worker.actor.micro_batch_size_per_device_for_update=2"])
    assert (config.dp_size, config.mini_batch_samples("actor")) == (2, 4)
    micro, first, later = update_batches(config)["actor"]
    assert micro == 2
    tokens = [int(b["attention_mask"].sum()) for b in (first, later)]
    assert tokens == [config.token_budget(2), 2 * config.token_budget(2)]
