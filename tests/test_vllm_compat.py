"""easyrl.workers.vllm_compat across the vLLM range: the weight sync takes ``reload_weights`` where the worker has it
(vLLM 0.23, 0.32 and 0.33 on GPUs and the CPU) and vLLM 0.23's native start/update/finish calls where it does not
(vllm-ascend 0.23's ``NPUWorker``), through the in-process weight-transfer backend registered for the 0.23 line.

The native calls themselves cannot run on the CPU: vLLM 0.23's ``Worker.update_weights`` ends in
``torch.accelerator.synchronize()``, which raises "RuntimeError: Found no NVIDIA driver on your system" on a machine
without an accelerator; the stand-in worker below has the NPU worker's three methods and nothing else.
"""

from __future__ import annotations

import types

import pytest
import torch

from easyrl.workers import vllm_compat


class _NativeOnlyWorker:
    """The weight-update surface of vllm-ascend 0.23's NPUWorker: start/update/finish, no ``reload_weights``; its
    engine is the one vLLM's factory builds from ``weight_transfer_config`` (here: whatever the test passes)."""

    def __init__(self, engine):
        self.weight_transfer_engine = engine
        self.calls: list[str] = []
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def start_weight_update(self, is_checkpoint_format: bool = True) -> None:
        self.calls.append(f"start(is_checkpoint_format={is_checkpoint_format})")

    def update_weights(self, update_info: dict) -> None:
        self.calls.append("update")
        info = self.weight_transfer_engine.parse_update_info(update_info)
        self.weight_transfer_engine.receive_weights(info, load_weights=self.loaded.extend)

    def finish_weight_update(self) -> None:
        self.calls.append("finish")


class _ReloadWorker:
    def reload_weights(self, weights_iterator=None):
        self.loaded = list(weights_iterator)


def _pairs():
    return [("model.embed_tokens.weight", torch.ones(2, 2)), ("lm_head.weight", torch.zeros(2, 2))]


def test_reload_weights_goes_through_whichever_api_the_worker_has():
    worker = _ReloadWorker()
    vllm_compat.reload_weights(worker, iter(_pairs()))
    assert [n for n, _ in worker.loaded] == ["model.embed_tokens.weight", "lm_head.weight"]

    class Engine:  # vLLM 0.23's engine protocol, as the in-process backend implements it
        def parse_update_info(self, update_info):
            return update_info["weights"]

        def receive_weights(self, info, load_weights):
            load_weights(info)

    native = _NativeOnlyWorker(Engine())
    vllm_compat.reload_weights(native, iter(_pairs()))
    assert native.calls == ["start(is_checkpoint_format=True)", "update", "finish"]
    assert [n for n, _ in native.loaded] == ["model.embed_tokens.weight", "lm_head.weight"]

    with pytest.raises(RuntimeError, match="no reload_weights, and no weight-transfer engine"):
        vllm_compat.reload_weights(_NativeOnlyWorker(None), iter(_pairs()))


def test_the_in_process_backend_exists_only_on_the_0_23_line():
    version = vllm_compat.vllm_version()
    if version is None or version >= (0, 24):
        # vLLM 0.32: every worker has reload_weights, and the native calls changed their signatures
        assert vllm_compat.weight_transfer_kwargs() == {}
        return
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    kwargs = vllm_compat.weight_transfer_kwargs()
    assert kwargs == {"weight_transfer_config": {"backend": vllm_compat.IN_PROCESS_TRANSFER}}
    assert vllm_compat.weight_transfer_kwargs() == kwargs  # a second engine in the process: registered once
    # what vLLM 0.23's worker does with it in load_model, and in update_weights
    engine = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=vllm_compat.IN_PROCESS_TRANSFER),
                                                       None, torch.nn.Linear(2, 2))
    native = _NativeOnlyWorker(engine)
    vllm_compat.reload_weights(native, iter(_pairs()))
    assert native.calls == ["start(is_checkpoint_format=True)", "update", "finish"]
    assert [n for n, _ in native.loaded] == ["model.embed_tokens.weight", "lm_head.weight"]


def test_the_colocated_engine_runs_in_process_and_without_fractal_nz():
    # (vllm-ascend 0.23 refuses wake_up and start_weight_update while VLLM_ASCEND_ENABLE_NZ is on, its default: NPU
    # workers get VLLM_ASCEND_ENABLE_NZ=0 from easyrl.workers.group.worker_runtime_env, tests/test_worker_setup.py)
    assert vllm_compat.IN_PROCESS_ENGINE_ENV == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def _reload_after_npu_wake_up(untranspose: bool) -> dict:
    """In a spawned child (vLLM's modules set platform state that later tests in pytest's process must not see): an
    MoE layer post-processed as vllm-ascend 0.23 does, its weights replaced by transposed views as its ``wake_up`` does,
    then (after ``untranspose_moe_weights`` or not) vLLM's layer-wise reload of new weights."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload, initialize_layerwise_reload,
                                                         record_metadata_for_reloading)

    class AscendLikeMoEMethod(QuantizeMethodBase):  # AscendUnquantizedFusedMoEMethod's post-processing
        def create_weights(self, *args, **kwargs):
            pass

        def apply(self, *args, **kwargs):
            pass

        def process_weights_after_loading(self, layer):
            for name in ("w13_weight", "w2_weight"):
                setattr(layer, name, torch.nn.Parameter(getattr(layer, name).data.transpose(1, 2).contiguous(),
                                                        requires_grad=False))

    experts, hidden, inter = 2, 8, 3  # 2I = 6 != H: the copy into a view fails
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.zeros(experts, 2 * inter, hidden), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(torch.zeros(experts, hidden, inter), requires_grad=False)
    layer.quant_method = AscendLikeMoEMethod()
    model = torch.nn.Sequential(layer)
    record_metadata_for_reloading(model)
    layer.quant_method.process_weights_after_loading(layer)
    storage = {n: p.data_ptr() for n, p in layer.named_parameters()}
    for name, param in list(layer.named_parameters()):  # NPUWorker.wake_up (vllm-ascend v0.23.0 worker.py:253-268)
        setattr(layer, name, torch.nn.Parameter(param.transpose(1, 2), requires_grad=False))
    facts = {"changed": vllm_compat.untranspose_moe_weights(model) if untranspose else []}
    new = {"w13_weight": torch.randn(experts, 2 * inter, hidden), "w2_weight": torch.randn(experts, hidden, inter)}
    try:
        initialize_layerwise_reload(model)
        for name, tensor in new.items():
            getattr(layer, name).weight_loader(getattr(layer, name), tensor)
        finalize_layerwise_reload(model, None)
    except RuntimeError as error:
        return {**facts, "error": str(error)}
    facts["loaded"] = all(torch.equal(getattr(layer, n), t.transpose(1, 2)) for n, t in new.items())
    facts["same_storage"] = all(getattr(layer, n).data_ptr() == storage[n] for n in new)
    facts["changed_again"] = vllm_compat.untranspose_moe_weights(model)
    return facts


def test_moe_weights_transposed_by_the_npu_wake_up_reload_in_their_loaded_layout():
    """vllm-ascend 0.23's ``wake_up(tags=["weights"])`` re-registers the post-processed fused-MoE weights (E, H, 2I)
    as transposed views (E, 2I, H); vLLM's layer-wise reload (the weight sync) then copies the reprocessed tensor into
    the view and fails. ``untranspose_moe_weights`` undoes the views first: the reload lands in the original storage."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        broken, fixed = pool.submit(_reload_after_npu_wake_up, False).result(), \
            pool.submit(_reload_after_npu_wake_up, True).result()
    assert "must match the size" in broken["error"]  # the crash of the first weight sync on NPU (review S2-A)
    assert fixed == {"changed": ["0.w13_weight", "0.w2_weight"], "loaded": True, "same_storage": True,
                     "changed_again": []}


def _moe_layer(experts: int = 2, hidden: int = 8, inter: int = 3) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.zeros(experts, hidden, 2 * inter), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(torch.zeros(experts, inter, hidden), requires_grad=False)
    return layer


class _AscendLikeLLM:
    """An engine of one worker whose ``wake_up`` with the weights re-registers ``transposes`` (names of its model's
    parameters) as transposed views, as vllm-ascend 0.23.0.post1's ``NPUWorker.wake_up`` does (worker.py:253-270)."""

    def __init__(self, model: torch.nn.Module, transposes: tuple[str, ...]):
        self.model, self.transposes, self.calls = model, transposes, []
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: model))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))
        if tags is None or "weights" in tags:
            for name in self.transposes:
                parent, _, leaf = name.rpartition(".")
                module = self.model.get_submodule(parent)
                setattr(module, leaf, torch.nn.Parameter(getattr(module, leaf).transpose(1, 2), requires_grad=False))

    def collective_rpc(self, fn, kwargs=None):
        self.calls.append(fn.__name__)
        return [fn(self.worker, **(kwargs or {}))]


@pytest.mark.parametrize("version", [(0, 23), (0, 26), (0, 32)])
@pytest.mark.parametrize("tags, woken", [(["weights"], True), (None, True), (["kv_cache"], False)])
def test_waking_the_weights_undoes_the_transposes_of_wake_up_whatever_the_version(monkeypatch, version, tags, woken):
    """By behaviour (device review 2026-12-02, S3-N7: vllm-ascend's release candidates past 0.23 still transpose): the
    views this ``wake_up`` made are re-registered as their storage on any vLLM line; a view from before the call (a
    kernel's own layout) is kept; waking only the KV cache touches no weight."""
    monkeypatch.setattr(vllm_compat, "vllm_version", lambda: version)
    model = torch.nn.Sequential(_moe_layer(), _moe_layer())
    model[1].w2_weight = torch.nn.Parameter(model[1].w2_weight.transpose(1, 2), requires_grad=False)  # the kernel's
    llm = _AscendLikeLLM(model, transposes=("0.w13_weight", "0.w2_weight"))
    vllm_compat.wake_up(llm, tags)
    assert vllm_compat.moe_weight_views(model) == ["1.w2_weight"]
    assert model[0].w13_weight.shape == (2, 8, 6) and model[0].w13_weight.is_contiguous()
    rpcs = ["_worker_moe_views", ("wake_up", tags), "_untranspose_worker_moe_weights"] if woken else [("wake_up", tags)]
    assert llm.calls == rpcs


def test_the_moe_view_check_finds_nothing_on_an_engine_that_keeps_its_layout():
    """vLLM on CUDA/CPU and vllm-ascend main (#13012): ``wake_up`` keeps the parameters, nothing is re-registered."""
    model = torch.nn.Sequential(_moe_layer())
    llm = _AscendLikeLLM(model, transposes=())
    before = {name: p for name, p in model.named_parameters()}
    vllm_compat.wake_up(llm, ["weights"])
    assert {name: p for name, p in model.named_parameters()} == before

def test_state_layers_are_read_off_vllms_registry():
    """``has_state_layers``: vLLM's own answer per architecture (Gated DeltaNet, Mamba: True), False for an attention
    model and for an architecture vLLM does not list (Qwen3.5-MoE and Llama: classes whose model info
    tests/test_e2e_qwen3_archs.py and the Llama tests have cached already; another costs a vLLM subprocess)."""
    assert vllm_compat.has_state_layers("Qwen3_5MoeForConditionalGeneration")
    assert not vllm_compat.has_state_layers("LlamaForCausalLM")
    assert not vllm_compat.has_state_layers("NoSuchForCausalLM")


def test_a_by_copy_family_reloads_its_held_weights_after_the_layerwise_reload():
    """gpt-oss's loader copies its experts and sinks into the parameters, which vLLM's layer-wise reload would lose:
    those weights are held back and loaded after it by the model's own ``load_weights`` (the self-check's
    ``vllm_synced`` of gpt-oss: 2.6 nat without this, 4.8e-6 with it); on the CPU only, and only for the listed
    classes."""
    calls = []

    class GptOssForCausalLM:
        def load_weights(self, weights):
            calls.append(("direct", [name for name, _ in weights]))

    model = GptOssForCausalLM()
    worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(get_model=lambda: model),
        reload_weights=lambda weights_iterator: calls.append(("layerwise", [n for n, _ in weights_iterator])))
    by_copy = vllm_compat.reload_by_copy(model, "cpu")
    assert by_copy and vllm_compat.reload_by_copy(model, "cuda") == ()
    assert vllm_compat.reload_by_copy(types.SimpleNamespace(), "cpu") == ()
    names = ["model.layers.0.attn.sinks", "model.layers.0.attn.q_proj.weight", "model.layers.0.mlp.experts.down_proj"]
    vllm_compat.reload_weights(worker, iter((n, torch.zeros(1)) for n in names), by_copy=by_copy)
    assert calls == [("layerwise", [names[1]]), ("direct", [names[0], names[2]])]
