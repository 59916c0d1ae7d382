"""The experience forwards' estimate (easyrl.sizing.experience.estimate_experience: old log-probs, reference,
teacher, reward model, each with vLLM asleep) against ``easyrl simulate``'s count of the same forwards on the
simulated device, for Qwen2.5-7B's real widths on 2 layers (fake tensors cost the same CPU time whatever their size),
and the verdict naming the experience phase and the setting that sizes it when one cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from easyrl.config import load_config
from easyrl.errors import ConfigError
from easyrl.simulate import report
from easyrl.simulate.phases import simulate
from easyrl.sizing.anatomy import model_anatomy, model_shape
from easyrl.sizing.devices import DEVICES
from easyrl.sizing.estimate import EXPERIENCE_SETTINGS, check_memory, estimate_memory
from easyrl.sizing.experience import RoleModel, estimate_experience, experience_models

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.05
SHORT_ROWS = ("data.max_prompt_length=512", "data.max_response_length=512")  # 16 x 1024 tokens: attention is small


def _model(folder: Path, layers: int = 2) -> str:
    """Qwen2.5-7B-Instruct's config.json (easyrl/model_configs) with ``layers`` layers."""
    config = json.loads((ROOT / "easyrl" / "model_configs" / "Qwen2.5-7B-Instruct" / "config.json").read_text())
    config.update(num_hidden_layers=layers, layer_types=config["layer_types"][:layers])
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _estimate(path: str, *overrides: str, capacity: float = DEVICES["h100"].memory_gib):
    from transformers import AutoConfig

    config = load_config([f"config={ROOT / 'config.yaml'}", f"worker.actor.model.model_path={path}", *overrides])
    hf_config = AutoConfig.from_pretrained(path)
    num_params, vocab = model_anatomy(hf_config)[:2]
    estimate = estimate_memory(num_params, vocab, config, capacity, model_shape(hf_config))
    estimate_experience(estimate, config, RoleModel(num_params, vocab, model_shape(hf_config)))
    return config, estimate


def test_estimate_follows_the_simulated_experience_forwards(tmp_path):
    """Old log-probs and reference forwards (16 rows x 1024 tokens, the reference resident): the estimate (less the
    actor's AdamW states, which the simulation, before any update, does not hold yet) within 5% of the simulated
    peak: the actor's float32 shard, the reference's bf16 shard, the gathered embedding + LM head and two decoder
    layers, and one MLP's ``3 x intermediate + 4 x hidden`` activations per token."""
    config, estimate = _estimate(_model(tmp_path / "model"), "worker.ref.offload.offload_params=false", *SHORT_ROWS)
    sim = simulate(config, DEVICES["h100"], log=lambda _: None, update=False)
    simulated = {p.name: p for p in sim.phases if p.name in estimate.experience}
    assert list(simulated) == ["old log-probs (forward)", "reference forward"]
    for name, phase in simulated.items():
        column = float(report.experience_column(phase, estimate))
        assert column == pytest.approx(phase.peak_gib, rel=TOLERANCE), (name, estimate.experience[name], phase)
    lines = report.table(sim, estimate, {"trainer": None}, "h100", config.world_size).splitlines()
    assert "experience forward: reference forward" in "\n".join(lines)
    assert lines[-2].startswith("not seen: the other ranks (rank 0 runs alone")  # what it cannot see, by the verdict


def test_an_experience_forward_that_cannot_fit_names_its_phase_and_setting(tmp_path):
    """40 rows of 8192 tokens per experience forward (327680 tokens: ~43 GiB of one MLP's activations) on an A100
    40 GB: the update (4 rows) fits, the old-log-prob forward does not; both the pre-flight check and the
    simulation's verdict name the phase and ``worker.actor.micro_batch_size_per_device_for_experience``."""
    spec = DEVICES["a100-40"]
    config, estimate = _estimate(_model(tmp_path / "model"), "data.max_prompt_length=4096",
                                 "data.max_response_length=4096",
                                 "worker.actor.micro_batch_size_per_device_for_experience=40", capacity=spec.memory_gib)
    assert estimate.training_gib < estimate.capacity_gib
    with pytest.raises(ConfigError, match=r"experience phase 'old log-probs \(forward\)'.*"
                                          r"worker\.actor\.micro_batch_size_per_device_for_experience"):
        check_memory(estimate)
    sim = simulate(config, spec, log=lambda _: None, update=False)
    print({p.name: round(p.peak_gib, 2) for p in sim.phases},
          {k: round(sum(v.values()), 2) for k, v in estimate.experience.items()})
    problem = report.verdict(sim, estimate, None)
    assert "'old log-probs (forward)'" in problem and EXPERIENCE_SETTINGS["old log-probs (forward)"] in problem


def test_the_reward_model_forward_names_its_own_settings(tmp_path):
    """A reward-model forward over the device (resident reward model, 96 rows of 8192 tokens) names
    ``worker.reward.reward_model``'s micro-batch settings, not the actor's (the simulation's generic verdict named
    the actor's for every phase)."""
    from transformers import AutoConfig

    from easyrl.simulate.phases import PhaseResult, Simulation

    path = _model(tmp_path / "model")
    rm = ("worker.reward.reward_model.model_path=" + path, "worker.reward.reward_model.micro_batch_size_per_device=96",
          "worker.reward.reward_model.max_length=8192", "worker.reward.reward_model.offload.offload_params=false")
    config, estimate = _estimate(path, *rm)
    hf_config = AutoConfig.from_pretrained(path)
    estimate_experience(estimate, config, RoleModel(*model_anatomy(hf_config)),
                        **experience_models(config))
    needed = sum(estimate.experience["reward model forward"].values())
    assert needed > estimate.capacity_gib > sum(estimate.experience["old log-probs (forward)"].values())
    with pytest.raises(ConfigError, match=r"'reward model forward'.*worker\.reward\.reward_model\.micro_batch"):
        check_memory(estimate)
    sim = Simulation([PhaseResult("reward model forward", needed, 1.0, 1.0)])
    problem = report.verdict(sim, estimate, None)
    assert "'reward model forward'" in problem and "worker.reward.reward_model.micro_batch_size_per_device" in problem


def test_the_forward_start_holds_a_large_root_group_twice():
    """The Qwen3.5-27B recipe (8 x H100, actor offloaded, 4 x 4096 tokens of old log-probs with 4 x 7744 patches):
    ``easyrl simulate`` peaks at 10.95 GiB before the first vision block, not in a decoder layer: FSDP2 keeps the
    root group's all-gather output (4.83 GiB: the 248320 x 5120 embedding and LM head) beside its unsharded
    parameters until the next group's copy-out, with the tower's pixels and position-embedding interpolation (1.13).
    The estimate was 8.9 (a decoder layer's peak: -18%); ``easyrl.sizing.experience.forward_peak``'s start counts
    10.76. The 7B recipe (config.yaml) still peaks inside a layer (17.0 vs 17.1 simulated:
    tests/test_simulate_images.py)."""
    from transformers import AutoConfig

    from easyrl.simulate.phases import model_folder

    model = "Qwen/Qwen3.5-27B"
    config = load_config([f"config={ROOT / 'config.yaml'}", f"worker.actor.model.model_path={model}",
                          "worker.actor.offload.offload_params=true",
                          "worker.actor.micro_batch_size_per_device_for_update=1",
                          "worker.actor.micro_batch_size_per_device_for_experience=4", "trainer.n_gpus_per_node=8"])
    shape = model_shape(AutoConfig.from_pretrained(model_folder(model)))
    estimate = estimate_memory(27_356_728_560, 248320, config, DEVICES["h100"].memory_gib, shape)
    phases = estimate_experience(estimate, config, RoleModel(27_356_728_560, 248320, shape))
    for phase in ("old log-probs (forward)", "reference forward"):
        items = phases[phase]
        assert sum(items.values()) == pytest.approx(10.95, rel=0.03), items
        assert items[f"{phase}: vision tower before its first block"] == pytest.approx(1.13, abs=0.01)


def test_a_small_budget_peaks_at_the_forward_start(tmp_path):
    """One row of 1024 tokens, actor offloaded (Qwen2.5-7B widths, 2 layers): the simulated old-log-prob forward
    peaks at the first decoder layer's copy-out, before any activations, holding the root group twice (its
    parameters and the all-gather output FSDP2 keeps until then: 2.03 GiB each) and the first layer twice (0.43 GiB
    each): 4.94 GiB; the estimate inside a layer (root + two layers + one MLP) was 3.03 (-39%)."""
    config, estimate = _estimate(_model(tmp_path / "model"), "worker.actor.offload.offload_params=true",
                                 "worker.actor.micro_batch_size_per_device_for_experience=1", *SHORT_ROWS)
    sim = simulate(config, DEVICES["h100"], log=lambda _: None, update=False)
    phase = next(p for p in sim.phases if p.name == "old log-probs (forward)")
    assert float(report.experience_column(phase, estimate)) == pytest.approx(phase.peak_gib, rel=TOLERANCE)
