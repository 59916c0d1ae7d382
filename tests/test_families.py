"""The model-family registry (``easyrl.models.families``): its hooks, the refusal of other families, and docs/models.md
checked against it, the parity tests and easyrl/model_configs (the table cannot drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from easyrl.errors import ModelError
from easyrl.models.families import FAMILIES, check_supported, family, text_config
from easyrl.testing.tiny_families import TINY_FAMILIES, tiny_family_config
from easyrl.testing.tiny_vl import TINY_VL_ARCHS

REPO = Path(__file__).resolve().parents[1]


def _rows() -> dict[str, list[str]]:
    """docs/models.md's table: model_type -> [family, modality, experts, tested, known limits]."""
    lines = [line for line in (REPO / "docs/models.md").read_text().splitlines() if line.startswith("| `")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert all(len(row) == 6 for row in cells), [line for line, row in zip(lines, cells) if len(row) != 6]
    rows = {row[0].strip("`"): row[1:] for row in cells}
    assert len(rows) == len(lines), "a model_type has two rows"
    return rows


def test_models_doc_has_one_row_per_family_with_its_traits():
    rows = _rows()
    assert sorted(rows) == sorted(FAMILIES)
    for model_type, (name, modality, experts, _tested, _limits) in rows.items():
        entry = FAMILIES[model_type]
        assert (name, modality, experts) == (entry.name, "VL" if entry.vision else "text",
                                                      "MoE" if entry.moe else "dense"), model_type


def test_models_doc_claims_only_what_is_tested():
    """"parity": the family is in tests/test_model_families.py's parametrizations (``TINY_FAMILIES``, and
    ``TINY_VL_ARCHS`` with images) and back;
    "simulate (NAME)": easyrl/model_configs/NAME/config.json is of that model_type; "step (TEST)": the test exists."""
    for model_type, (_name, _modality, _experts, tested, _limits) in _rows().items():
        assert ("parity" in tested) == (model_type in TINY_FAMILIES or model_type in TINY_VL_ARCHS), model_type
        assert ("with images" in tested) == (model_type in TINY_VL_ARCHS), model_type
        for name in re.findall(r"simulate \(([^)]+)\)", tested):
            config = json.loads((REPO / "easyrl/model_configs" / name / "config.json").read_text())
            assert config["model_type"] == model_type, (model_type, name)
        for test in re.findall(r"step \(`([^`]+)`\)", tested):
            assert (REPO / test).is_file(), test


def test_every_tiny_model_is_its_family():
    for model_type in TINY_FAMILIES:
        assert tiny_family_config(model_type).model_type == model_type


def test_unlisted_family_is_refused_with_the_docs_pointer():
    from transformers import Olmo2Config

    with pytest.raises(ModelError, match=r"model_path: model_type 'olmo2' is not a family .* docs/models\.md"):
        check_supported("worker.actor.model.model_path", Olmo2Config())
    check_supported("worker.actor.model.model_path", tiny_family_config("granite"))
    assert family(Olmo2Config()).positions is FAMILIES["llama"].positions  # the forward's generic entry


def test_text_config_is_the_language_model_s_part():
    """A VL config's ``text_config``, a text config itself, and an object without ``get_text_config`` itself."""
    from types import SimpleNamespace

    from transformers import Qwen2VLConfig

    vl = Qwen2VLConfig()
    assert text_config(vl) is vl.text_config and text_config(vl.text_config) is vl.text_config
    plain = SimpleNamespace(sliding_window=8)
    assert text_config(plain) is plain


def test_granite_logit_scale_reaches_the_fused_head():
    """Granite divides its logits by ``logits_scaling`` (8 in the tiny model): the fused head's log-probs are those of
    the model's own logits."""
    from transformers import GraniteForCausalLM

    from easyrl.models.fused_head import FusedLogProbHead

    config = tiny_family_config("granite")
    config.update(dict(vocab_size=512, num_hidden_layers=1))
    torch.manual_seed(0)
    model = GraniteForCausalLM(config).eval()
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        reference = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        head = FusedLogProbHead(model)
        with head.scoring(ids[0, 1:], temperature=1.0):
            fused = model(ids, logits_to_keep=torch.arange(11)).logits[0, :, 0]
    assert head.logit_scale == 1 / 8
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)


def test_the_moe_trait_is_the_config_s_router():
    """``moe`` (routed experts) holds exactly for the tiny models whose config has a router that returns its
    load-balancing loss (``worker.actor.router_aux_loss_coef`` is refused for the others)."""
    from easyrl.workers.policy import has_router

    for model_type in TINY_FAMILIES:
        assert FAMILIES[model_type].moe == has_router(tiny_family_config(model_type)), model_type


@pytest.mark.parametrize("model_type, layout", [
    ("glm4v", {"pixel_values": (4, 1176), "image_grid_thw": (1, 3)}),  # Qwen-like patch grid (temporal patch 2)
    ("hunyuan_vl", {"pixel_values": (4, 768), "image_grid_thw": (1, 3)}),  # patch grid, one frame
    ("lfm2_vl", {"pixel_values": (1, 4, 768), "pixel_attention_mask": (1, 4), "spatial_shapes": (1, 2)}),  # NaFlex
    ("minicpmv4_6", {"pixel_values": (1, 3, 16, 256), "target_sizes": (1, 2)}),  # patches in a row
    ("smolvlm", {"pixel_values": (1, 1, 3, 64, 64), "pixel_attention_mask": (1, 1, 64, 64)}),  # one tile, merge 2
    ("llava_next", {"pixel_values": (1, 3, 3, 336, 336), "image_sizes": (1, 2)}),  # anyres tiles
    ("paligemma", {"pixel_values": (1, 3, 224, 224)}),  # one image of the tower's size
])
def test_generic_blank_image_is_the_layout_get_image_features_names(model_type, layout):
    """A VL type outside the registry gets the blank image its ``get_image_features`` parameters name (the tower runs
    on it for a text-only micro-batch: ``easyrl.workers.vl_hooks``), only with keyword arguments it takes."""
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    blank = family(config).blank_image(config)
    assert {key: tuple(value.shape) for key, value in blank.items() if isinstance(value, torch.Tensor)} == layout


def test_pixtral_and_idefics3_blanks_fit_any_patch_grid():
    """Mistral 3's blank is two merged tokens (with one, its projector squeezes the token axis away) and Idefics3's
    one tile of ``merge x merge`` patches (transformers' default config: a 224 / 32 = 7-patch grid, which its pixel
    shuffle by 2 cannot split)."""
    from transformers import CONFIG_MAPPING

    mistral3, idefics3 = CONFIG_MAPPING["mistral3"](), CONFIG_MAPPING["idefics3"]()
    blank = FAMILIES["mistral3"].blank_image(mistral3)
    assert blank["image_sizes"].tolist() == [[28, 56]] and blank["pixel_values"].shape == (1, 3, 28, 56)
    assert FAMILIES["idefics3"].blank_image(idefics3)["pixel_values"].shape == (1, 1, 3, 64, 64)


@pytest.mark.parametrize("model_type", [name for name, entry in FAMILIES.items() if entry.vision])
def test_vision_parts_are_the_registry_s_and_freezing_holds_to_the_tower(model_type):
    """Every VL family's registry entry names a tower (and projector) its transformers model holds, which
    ``freeze_vision_tower`` freezes and nothing else (was: only Qwen-VL's ``model.visual``, other towers refused); an
    unlisted family's tower is found by name."""
    from transformers import AutoConfig

    from easyrl.models.families import vision_parts
    from easyrl.testing.tiny import TINY_ARCHS, tiny_config
    from easyrl.testing.tiny_vl import build_tiny_vl
    from easyrl.workers.fsdp_model import build_empty_model, frozen_towers

    config = (tiny_config(model_type) if model_type in TINY_ARCHS
              else AutoConfig.from_pretrained(build_tiny_vl(model_type)))
    entry = FAMILIES[model_type]
    model = build_empty_model(config, torch.float32, False, "sdpa")
    parts = ([entry.vision_tower], [entry.projector] if entry.projector else [])
    assert vision_parts(model) == parts
    for tower in frozen_towers(model):
        tower.requires_grad_(False)
    frozen = [name for name, param in model.named_parameters() if not param.requires_grad]
    assert frozen and all(name.startswith(f"{entry.vision_tower}.") for name in frozen)
    model.config.model_type = "unlisted_vl"  # the generic entry: the same parts, found by their names
    assert family(model.config).name == "unlisted" and vision_parts(model) == parts
