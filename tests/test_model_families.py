"""Model families beyond the Qwen ones (issue #37): per family, on its tiny random model (``easyrl.testing``), in one
process without Ray (``easyrl.trainer.parity.family_parity``): the FSDP2 actor's packed log-probs equal its padded
ones, an exported checkpoint loads in transformers and in vLLM with the actor's log-probs, and after a perturbation and
the weight sync vLLM's log-probs equal the actor's again (fp32, the Qwen tests' bounds). A planted position-id mistake
in a family's hook makes the parity fail.

One in-process vLLM engine per family (~25-40 s each on the 2-core machine, most of it the engine's start-up).
"""

from __future__ import annotations

import dataclasses

import pytest

from easyrl.testing.tiny_families import TINY_FAMILIES
from easyrl.testing.tiny_vl import TINY_VL_ARCHS, build_tiny_vl

pytestmark = pytest.mark.e2e


# three under `make test-slow` (the suite's time, docs/development.md): each has the registry traits
# (easyrl.models.families) of one kept in the suite: Mistral Gemma 3's (halved rotary, sliding window), Granite
# Llama's, OLMoE Qwen3-MoE's (softmax-top-k router); what else sets them apart is transformers' and vLLM's own code
SLOW_FAMILIES = ("mistral", "granite", "olmoe")


@pytest.mark.parametrize("model_type", [pytest.param(family, marks=pytest.mark.slow) if family in SLOW_FAMILIES
                                        else family for family in TINY_FAMILIES])
def test_family_parity(model_type, tiny_model_path, tmp_path):
    from easyrl.models.families import FAMILIES
    from easyrl.trainer.parity import family_parity

    assert model_type in FAMILIES  # a tiny model of a family the pre-flight would refuse tests nothing
    parity = family_parity(tiny_model_path(model_type), tmp_path)
    print(f"FAMILY {model_type} {parity}")
    assert not parity.failures(), parity


def test_planted_position_mistake_fails_the_parity(tiny_model_path, tmp_path, monkeypatch):
    """Positions counted in steps of 2 in Llama's ``positions`` hook (a mistake such as counting a token twice): the
    packed forward cuts every token into its own sequence, and transformers' own forward (which numbers the tokens
    itself, as vLLM does) disagrees with the actor. Without vLLM: the actor's checks fail already (seconds)."""
    from easyrl.models import families
    from easyrl.trainer.parity import family_parity

    entry = families.FAMILIES["llama"]
    monkeypatch.setitem(families.FAMILIES, "llama", dataclasses.replace(
        entry, positions=lambda mask: entry.positions(mask) * 2))
    failures = " ".join(family_parity(tiny_model_path("llama"), tmp_path, vllm=False).failures())
    assert "packed_vs_padded" in failures and "transformers_export" in failures, failures


# two of the four under `make test-slow` (the suite's time, docs/development.md): InternVL and Idefics3 keep the
# generic VL path (1-D positions) in the suite
SLOW_VL = ("mistral3", "llava_onevision")


@pytest.mark.parametrize("arch", [pytest.param(arch, marks=pytest.mark.slow) if arch in SLOW_VL else arch
                                  for arch in TINY_VL_ARCHS])
def test_vl_family_parity(arch, tmp_path):
    """A vision-language family beyond Qwen, with an image in every prompt (``easyrl.testing.image_batch``: the run's
    data path): vLLM, given one placeholder per image as in a rollout, expands it to the processor's ids, and its
    log-probs equal the actor's (the same four checks)."""
    from easyrl.models.families import FAMILIES
    from easyrl.testing.image_batch import image_batch
    from easyrl.trainer.parity import family_parity

    assert FAMILIES[arch].vision
    folder = build_tiny_vl(arch)
    parity = family_parity(folder, tmp_path, data=image_batch(folder))
    print(f"FAMILY {arch} {parity}")
    assert not parity.failures(), parity
