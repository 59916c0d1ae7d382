"""The self-check of a model family (issue #49, ``easyrl.trainer.selfcheck``): a planted wrong rotary, window or logit
scale in an admitted family fails its self-check naming the check; the cache key follows the versions and the
config's content, not its path; ``easyrl check-model`` prints the table of a tiny folder and caches the verdict.

The planted defects run the twin and the actor/transformers checks only (no vLLM: seconds each); the command runs the
whole check once (one in-process vLLM engine).
"""

from __future__ import annotations

import dataclasses
import json

import pytest


def _config(model_type: str):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def _failed_check(config, tmp_path) -> str:
    from easyrl.trainer.selfcheck import self_check

    verdict = self_check(config, tmp_path, vllm=False)
    assert not verdict.passed, verdict.table()
    return verdict.failed


def test_a_bare_model_type_is_checked_with_the_released_values_vllm_reads():
    """vLLM's Qwen3-VL-MoE reads ``norm_topk_prob`` (transformers' default config lacks it) and its GLM-4.1V
    ``attention_bias`` (the default says False, transformers' attention has biases anyway): a bare model_type's config
    carries the released values (``easyrl.models.twin.RELEASED``) into its twin; a folder's config is not touched."""
    from easyrl.models.twin import twin_config
    from easyrl.trainer.selfcheck import load_config

    assert twin_config(load_config("qwen3_vl_moe")).text_config.norm_topk_prob is True
    assert twin_config(load_config("glm4v")).text_config.attention_bias is True
    gemma3 = twin_config(load_config("gemma3")).vision_config  # a sub-config's key; a width alias follows the twin's
    assert (gemma3.image_size, gemma3.patch_size) == (896, 14)
    assert twin_config(load_config("lfm2")).block_dim == 256
    assert not hasattr(twin_config(_config("qwen3_vl_moe")).text_config, "norm_topk_prob")


def test_twin_keeps_the_layer_pattern_and_shrinks():
    """Gemma 3's twin keeps its 5 sliding + 1 global layer pattern (a window of 8 tokens), at width 256."""
    from easyrl.models.twin import twin_config

    twin = twin_config(_config("gemma3_text"))
    assert twin.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert (twin.num_hidden_layers, twin.hidden_size, twin.sliding_window, twin.head_dim) == (6, 256, 8, 64)
    assert twin.vocab_size <= 5120 and twin.architectures == ["Gemma3ForCausalLM"]


def test_the_planted_defects_pass_unplanted(tmp_path):
    """Without a planted defect the actor checks of Gemma 3's twin pass (so the failures below are the defects')."""
    from easyrl.trainer.selfcheck import self_check

    verdict = self_check(_config("gemma3_text"), tmp_path, vllm=False)
    assert verdict.passed, verdict.table()
    assert [r.passed for r in verdict.rows[:3]] == [True, True, True]


@pytest.mark.parametrize("model_type", ["llama4_text", "llama4"])
def test_llama4_twin_scores_packed_as_padded(model_type, tmp_path):
    """Llama 4's chunked layers (chunks of 32 in the twin, rows of up to 80 tokens) and its layers that give their
    attention no positions: the packed row scores as the padded batch (packed_vs_padded was 2.64 nats); the VL wrapper's
    twin builds its tower (the pixel-shuffle adapter's widths: ``twin.OVERRIDES``) and passes alike."""
    from easyrl.trainer.selfcheck import load_config, self_check

    verdict = self_check(load_config(model_type), tmp_path, vllm=False)
    assert verdict.passed, verdict.table()


def test_planted_wrong_rotary_fails_packed_vs_padded(tmp_path, monkeypatch):
    """Positions counted twice in the family's ``positions`` hook (the rotary sees other angles than transformers')."""
    from easyrl.models import families

    entry = families.FAMILIES["gemma3_text"]
    monkeypatch.setitem(families.FAMILIES, "gemma3_text",
                        dataclasses.replace(entry, positions=lambda mask: entry.positions(mask) * 2))
    assert _failed_check(_config("gemma3_text"), tmp_path) == "packed_vs_padded"


def test_planted_wrong_window_fails_packed_vs_padded(tmp_path, monkeypatch):
    """The packed attention's band 4 tokens wider than the config's window."""
    from easyrl.models import packed_attention

    band = packed_attention._window_mask
    wider = lambda length, window, chunk, device: band(  # noqa: E731
        length, None if window is None else window + 4, chunk, device)
    monkeypatch.setattr(packed_attention, "_window_mask", wider)
    assert _failed_check(_config("gemma3_text"), tmp_path) == "packed_vs_padded"


def test_planted_wrong_chunk_fails_packed_vs_padded(tmp_path, monkeypatch):
    """The packed attention's Llama 4 chunks 8 tokens longer than the config's: the check's rows are stretched past
    two chunks of the twin's 32 tokens (``parity.row_stretch``), so the longer chunk masks something."""
    from easyrl.models import packed_attention
    from easyrl.models.twin import CHUNK, twin_config
    from easyrl.trainer.parity import row_stretch
    from easyrl.trainer.selfcheck import load_config

    assert twin_config(load_config("llama4_text")).attention_chunk_size == CHUNK == 32
    assert row_stretch(twin_config(load_config("llama4_text"))) == 4 and row_stretch(_config("llama")) == 1
    band = packed_attention._window_mask
    longer = lambda length, window, chunk, device: band(  # noqa: E731
        length, window, None if chunk is None else chunk + 8, device)
    monkeypatch.setattr(packed_attention, "_window_mask", longer)
    assert _failed_check(load_config("llama4_text"), tmp_path) == "packed_vs_padded"


def test_planted_wrong_logit_scale_fails_packed_vs_padded(tmp_path, monkeypatch):
    """Granite's ``logit_scale`` hook returning the factor instead of its inverse."""
    from easyrl.models import families

    monkeypatch.setitem(families.FAMILIES, "granite", dataclasses.replace(
        families.FAMILIES["granite"], logit_scale=lambda config: config.logits_scaling))
    config = _config("granite")
    config.logits_scaling = 8.0
    verdict_check = _failed_check(config, tmp_path)
    assert verdict_check == "packed_vs_padded"


def test_the_generic_entry_reads_its_traits_off_the_config():
    """A type outside the registry: Cohere's logit_scale multiplies, Granite's logits_scaling divides (the default
    hook), and a VL config whose rotary has an mrope_section (GLM-4.1V's twin) numbers 3-D positions."""
    from easyrl.models.families import FAMILIES, family
    from easyrl.models.twin import twin_config

    cohere = _config("cohere")
    assert "cohere" not in FAMILIES and family(cohere).logit_scale(cohere) == cohere.logit_scale == 0.0625
    granite = _config("granite")
    granite.logits_scaling = 8.0
    assert family(granite).logit_scale(granite) == 1 / 8
    assert family(twin_config(_config("glm4v"))).mrope and not family(_config("llama")).mrope


def test_cache_key_follows_versions_and_content_not_paths():
    from easyrl.trainer.selfcheck import cache_key, versions

    config, other = _config("llama"), _config("llama")
    other._name_or_path = "/somewhere/else"
    assert cache_key(config) == cache_key(other)  # a copy of the same model elsewhere: the same verdict
    other.rope_parameters = dict(other.rope_parameters, rope_theta=1.0)
    assert cache_key(config) != cache_key(other)
    newer = dict(versions(), vllm="99.0")
    assert cache_key(config, newer) != cache_key(config)
    assert cache_key(config).startswith("llama-")


def test_verdict_names_the_failing_check_and_its_gap():
    """A failed verdict's reason names the check, the gap against its bound and the usual cause; the JSON round trip
    keeps it."""
    from easyrl.trainer.selfcheck import CHECKS, SelfCheck, _verdict

    progress = {"twin": 1.0, "actor": 2.0, "packed_vs_padded": 0.5}
    verdict = _verdict("foo", progress, None, 3.0, "foo-0")
    assert not verdict.passed and verdict.failed == "packed_vs_padded"
    assert "packed_vs_padded failed gap 0.5 > 1e-05" in verdict.reason() and "positions" in verdict.reason()
    assert SelfCheck.from_json(verdict.to_json()) == verdict
    assert [r.check for r in verdict.rows] == [c.name for c in CHECKS]


@pytest.mark.e2e
def test_check_model_prints_the_table_and_caches(tmp_path, monkeypatch, capsys):
    """``easyrl check-model FOLDER`` on a tiny Llama folder: every check passes; the second call reads the cache."""
    from easyrl.cli import main
    from easyrl.models.twin import write_twin

    folder = write_twin(_config("llama"), tmp_path / "tiny-llama")
    monkeypatch.setenv("EASYRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "verdict.json"
    assert main(["check-model", str(folder), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    for check in ("packed_vs_padded", "transformers_export", "vllm_export", "weight_names", "vllm_synced"):
        assert check in table
    assert "llama: PASS" in table and json.loads(out.read_text())["passed"]
    assert main(["check-model", str(folder)]) == 0
    assert "(cached:" in capsys.readouterr().out


def test_a_bf16_only_engine_is_judged_by_its_median():
    """vLLM-CPU runs Gated DeltaNet only in bf16 (Qwen3-Next, Qwen3.5): the parity engine is then bf16 and its gap
    the median |diff| under ENGINE_ATOL["bf16"], so a few near-tie tokens pass and a family computed otherwise (most
    tokens off) fails; the verdict shows that bound."""
    import torch

    from easyrl.trainer.parity import BF16_VLLM_ATOL, _engine_gap, engine_dtype
    from easyrl.trainer.selfcheck import _verdict

    assert engine_dtype(_config("qwen3_next")) == "bf16" and engine_dtype(_config("qwen3_5_text")) == "bf16"
    assert engine_dtype(_config("llama")) == "fp32" and engine_dtype(_config("jamba")) == "fp32"  # Mamba: fp32 runs
    mask = torch.ones(1, 10)
    near_ties = torch.tensor([[0.4, 0.3] + [0.01] * 8])
    assert _engine_gap(near_ties, torch.zeros(1, 10), mask, "bf16") <= BF16_VLLM_ATOL
    assert _engine_gap(near_ties, torch.zeros(1, 10), mask, "fp32") == pytest.approx(0.4)
    assert _engine_gap(torch.full((1, 10), 0.3), torch.zeros(1, 10), mask, "bf16") > BF16_VLLM_ATOL
    progress = {"twin": 1.0, "actor": 1.0, "export": 1.0, "packed_vs_padded": 0.0, "transformers_export": 0.0,
                "vllm engine": 1.0, "vllm score": 1.0, "vllm_export": 0.05, "engine_dtype": "bf16"}
    verdict = _verdict("qwen3_next", progress, None, 3.0, "k")
    assert next(r for r in verdict.rows if r.check == "vllm_export").passed and verdict.engine_dtype == "bf16"
    assert "<= 0.1" in verdict.table() and "bf16" in verdict.table()
    progress["engine_dtype"] = "fp32"
    assert _verdict("llama", progress, None, 3.0, "k").failed == "vllm_export"


def test_attention_sinks_run_the_models_own_eager_attention_per_sequence(tmp_path, monkeypatch):
    """gpt-oss (attention sinks, no SDPA in transformers): its twin's actor checks pass with ``PACKED_EAGER`` (its own
    eager attention, one call per packed sequence); the sinks dropped (SDPA per sequence instead) fail
    packed_vs_padded."""
    from transformers import AttentionInterface

    from easyrl.models.packed_attention import PACKED_EAGER, packed_sdpa_attention
    from easyrl.trainer.selfcheck import self_check

    verdict = self_check(_config("gpt_oss"), tmp_path / "own", vllm=False)
    assert verdict.passed, verdict.table()
    monkeypatch.setitem(AttentionInterface._global_mapping, PACKED_EAGER, packed_sdpa_attention)
    assert _failed_check(_config("gpt_oss"), tmp_path / "planted") == "packed_vs_padded"


def test_llama4_query_temperature_follows_the_engine(tmp_path):
    """vLLM 0.32 scales Llama 4's NoPE-layer queries only past a 32768-token context unless the generation config
    says; transformers always does, counting the index in the row (a packed row's earlier sequences, a left pad).
    The actor and the reference take the engine's setting, in memory only; another family is left as it is."""
    import json as json_

    from transformers import LlamaConfig, Llama4Config

    from easyrl.workers.trainable import match_engine_temperature

    config = Llama4Config()
    assert config.get_text_config().attn_temperature_tuning is True  # transformers' default
    assert match_engine_temperature(config, str(tmp_path), 4096) is False
    assert config.get_text_config().attn_temperature_tuning is False
    assert match_engine_temperature(config, str(tmp_path), 65536) is True
    (tmp_path / "generation_config.json").write_text(json_.dumps({"attn_temperature_tuning": True}))
    assert match_engine_temperature(config, str(tmp_path), 4096) is True
    llama = LlamaConfig()
    assert match_engine_temperature(llama, str(tmp_path), 4096) is None
    assert not hasattr(llama, "attn_temperature_tuning")
