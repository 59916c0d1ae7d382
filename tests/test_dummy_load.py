"""``load_format`` of the colocated engine (#20): the decision, and the loader that keeps what no sync restores.

vLLM's own ``load_format="dummy"`` randomises persistent buffers, among them the image normalisation of the VL
models (``FusedMMInputNorm``), which no checkpoint tensor restores: ``easyrl_dummy`` keeps them. These tests build
vLLM modules and loaders (in a spawned child) but start no engine.
"""

from __future__ import annotations

import pytest
import torch

from easyrl.workers.dummy_load import DUMMY_LOAD_FORMAT, keep_persistent_buffers, load_format

MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]  # Qwen2-VL's processor


@pytest.mark.parametrize("device", ["cuda", "npu"])
@pytest.mark.parametrize("version", [(0, 23), (0, 32), (0, 33)])
def test_dummy_on_the_checked_lines(device, version):
    assert load_format(device, version) == DUMMY_LOAD_FORMAT


@pytest.mark.parametrize("version, shown", [((0, 32), True), ((0, 23), False), ((0, 33), False)])
def test_cpu_dummy_only_where_the_end_to_end_parity_ran(version, shown):
    assert load_format("cpu", version) == (DUMMY_LOAD_FORMAT if shown else None)


@pytest.mark.parametrize("version", [None, (0, 22), (0, 24), (0, 31), (0, 34), (1, 0)])  # (0, 24)-(0, 31): not read
def test_disk_outside_the_checked_lines(version):
    assert load_format("cuda", version) is None


def test_keep_persistent_buffers_restores_every_persistent_buffer():  # vLLM 0.33 randomises int8/uint8 ones too
    module = torch.nn.Module()
    module.register_buffer("scale", torch.tensor([1.0, 2.0]))
    module.register_buffer("cache", torch.tensor([3.0]), persistent=False)
    module.register_buffer("index", torch.tensor([4]))
    module.weight = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    restore = keep_persistent_buffers(module)
    with torch.no_grad():
        for tensor in (module.scale, module.cache, module.weight):
            tensor.fill_(0.5)
        module.index.fill_(7)
    assert restore() == 2
    assert module.scale.tolist() == [1.0, 2.0] and module.index.tolist() == [4]  # restored
    assert module.cache.tolist() == [0.5] and module.weight.tolist() == [0.5, 0.5]  # not its business


def _vl_input_norm_model():
    """A module holding vLLM 0.32's ``FusedMMInputNorm`` (as ``visual.input_norm`` of Qwen2.5-VL) and a linear layer."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fusion import mm_input_norm

    with set_current_vllm_config(VllmConfig()):
        model = torch.nn.Module()
        model.input_norm = mm_input_norm.FusedMMInputNorm(MEAN, STD, 1 / 255)
    model.proj = torch.nn.Linear(3, 3)
    return model


def _vllm_facts() -> dict:
    """In a spawned child (vLLM's modules and config context set platform state that later tests in pytest's process,
    ``easyrl simulate``'s fake devices, must not see): what vLLM's and easyrl's dummy loaders leave in the image
    normalisation, and what a CPU tied head computes before and after ``repack_cpu_embedding_heads``."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    from easyrl.workers.dummy_load import register_dummy_loader
    from easyrl.workers.vllm_cpu_fixes import repack_cpu_embedding_heads

    facts = {}
    model = _vl_input_norm_model()
    DummyModelLoader(LoadConfig(load_format="dummy")).load_weights(model, None)
    facts["vllm_bias_absmax"] = model.input_norm.bias.abs().max().item()

    register_dummy_loader()
    model = _vl_input_norm_model()
    proj_before = model.proj.weight.detach().clone()
    get_model_loader(LoadConfig(load_format=DUMMY_LOAD_FORMAT)).load_weights(model, None)
    facts["easyrl_bias"] = model.input_norm.bias.tolist()
    facts["easyrl_weight"] = model.input_norm.weight.tolist()
    facts["proj_changed"] = not torch.equal(model.proj.weight, proj_before)
    facts["proj_absmax"] = model.proj.weight.abs().max().item()

    head = torch.nn.Module.__new__(ParallelLMHead)  # the class, without its tensor-parallel constructor
    torch.nn.Module.__init__(head)
    head.quant_method = UnquantizedEmbeddingMethod()
    head.weight = torch.nn.Parameter(torch.randn(256, 64), requires_grad=False)
    head.quant_method.process_weights_after_loading(head)  # the engine's load: packs the random weights
    x = torch.randn(3, 64)
    with torch.no_grad():
        head.weight.copy_(torch.randn(256, 64))  # the sync writes the actor's weights in place
    expected = torch.nn.functional.linear(x, head.weight)
    facts["repacked_off_cpu"] = repack_cpu_embedding_heads(head, "cuda")
    facts["stale_error"] = (head.quant_method.apply(head, x) - expected).abs().max().item()
    facts["repacked_on_cpu"] = repack_cpu_embedding_heads(head, "cpu")
    facts["repacked_error"] = (head.quant_method.apply(head, x) - expected).abs().max().item()
    return facts


@pytest.fixture(scope="module")
def vllm_facts() -> dict:
    import importlib.util
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if importlib.util.find_spec("vllm") is None:  # looks vLLM up without importing it here
        pytest.skip("vLLM is not installed")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_vllm_facts).result()


def test_vllm_dummy_loader_randomises_the_image_normalisation(vllm_facts):
    """The cause of the 0.64-nat gap: vLLM's dummy loader overwrites the persistent buffers ``rescale / std`` and
    ``-mean / std`` with U(-1e-3, 1e-3), and no checkpoint tensor writes them back."""
    assert vllm_facts["vllm_bias_absmax"] <= 1e-3  # -mean/std is about -1.8: gone


def test_easyrl_dummy_loader_keeps_the_image_normalisation(vllm_facts):
    expected_bias = [-m / s for m, s in zip(MEAN, STD)]
    assert vllm_facts["easyrl_bias"] == pytest.approx(expected_bias, rel=1e-6)
    assert vllm_facts["easyrl_weight"] == pytest.approx([1 / 255 / s for s in STD], rel=1e-6)
    assert vllm_facts["proj_changed"]  # parameters still randomised (no disk read)
    assert vllm_facts["proj_absmax"] <= 1e-3


def test_tied_head_is_repacked_after_a_sync(vllm_facts):
    """vLLM-CPU's embedding-shaped layers compute logits from a packed copy made at load time: a write into
    ``weight`` (what the reload does for a tied lm_head, which shares ``embed_tokens.weight``) does not reach it until
    ``repack_cpu_embedding_heads`` re-packs."""
    assert vllm_facts["repacked_off_cpu"] == 0  # off the CPU backend: nothing
    assert vllm_facts["stale_error"] > 1e-3  # the stale packed copy
    assert vllm_facts["repacked_on_cpu"] == 1
    assert vllm_facts["repacked_error"] <= 1e-4
