"""The colocated vLLM engine's arguments (``easyrl.workers.rollout.engine_arguments``), checked without starting vLLM
(#20: the review of the CUDA path)."""

from __future__ import annotations

import pytest

from easyrl.config import RolloutConfig
from easyrl.workers.dummy_load import DUMMY_LOAD_FORMAT
from easyrl.workers.group import worker_runtime_env
from easyrl.workers.rollout import engine_arguments


@pytest.mark.parametrize("device", ["cuda", "npu"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_custom_all_reduce_is_off(device, tp):
    """Ray shows each worker one GPU; vLLM's custom all-reduce looks the other TP ranks up in that one-entry
    CUDA_VISIBLE_DEVICES (IndexError while the engine is built): off, as EasyR1 does."""
    config = RolloutConfig(tensor_parallel_size=tp)
    args = engine_arguments("/models/m", config, device, seed=3, vision=False)
    assert args["disable_custom_all_reduce"] is True
    if tp > 1:
        assert args["tensor_parallel_size"] == tp and args["distributed_executor_backend"] == "external_launcher"
    else:
        assert "tensor_parallel_size" not in args
    # nor the other IPC paths: the FlashInfer all-reduce + RMSNorm fusion here, symmetric memory and the FlashInfer
    # all-reduce in the worker environment
    fusion_off = {"pass_config": {"fuse_allreduce_rms": False}} if device == "cuda" and tp > 1 else None
    assert args.get("compilation_config") == fusion_off
    env = worker_runtime_env(device, 1, {})
    ipc_all_reduce = [env.get(k) for k in ("VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER")]
    assert ipc_all_reduce == (["0", "0"] if device == "cuda" else [None, None])


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_accelerator_engine_starts_from_easyrl_dummy_weights(device):
    """The first sync overwrites every parameter: the engine does not read the checkpoint (``easyrl_dummy``: vLLM's
    dummy loader with the persistent buffers kept, easyrl.workers.dummy_load)."""
    args = engine_arguments("/models/m", RolloutConfig(), device, seed=0, vision=True)
    assert args["load_format"] == DUMMY_LOAD_FORMAT and args["model"] == "/models/m"
    assert args["enable_sleep_mode"] is True and "mm_processor_kwargs" in args
    assert args["mm_processor_cache_gb"] == 0  # no processed-image cache growing over a run (#27)


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_an_engine_that_nothing_syncs_reads_the_checkpoint(device):
    """``easyrl eval``'s engines (no FSDP model beside them unless a reward model scores) read the model folder: no
    dummy load format, whatever the device."""
    from easyrl.config import PPOConfig
    from easyrl.trainer.evaluation import eval_parts

    args = engine_arguments("/models/m", RolloutConfig(), device, seed=0, vision=False, read_checkpoint=True)
    assert "load_format" not in args and args["model"] == "/models/m"
    plain = PPOConfig()
    assert (eval_parts(plain).models, eval_parts(plain).engine_reads_checkpoint) == (False, True)
    plain.worker.reward.reward_model.model_path = "rm"
    assert plain.worker.reward.reward_model.enabled and eval_parts(plain).models


def test_cpu_engine_starts_from_easyrl_dummy_weights():
    """vLLM-CPU too: the sync re-packs tied embedding heads (vllm_cpu_fixes.repack_cpu_embedding_heads) and
    tests/test_e2e_grpo.py's parity passed with it; the CPU has no custom all-reduce or sleep mode to switch."""
    args = engine_arguments("/models/m", RolloutConfig(tensor_parallel_size=2), "cpu", seed=0, vision=False)
    assert args["load_format"] == DUMMY_LOAD_FORMAT
    assert "disable_custom_all_reduce" not in args and "enable_sleep_mode" not in args
    assert args["tensor_parallel_size"] == 2


def test_first_use_syncs_weights(monkeypatch):
    """Dummy weights are safe only because nothing generates before a sync: a new worker's rollout weights are
    stale (``_ensure_rollout_weights`` syncs before ``generate_sequences`` and ``rollout_score``)."""
    import inspect

    from easyrl.config import PPOConfig
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.rollout import VLLMRollout

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker sets it; restored after the test
    assert FSDPWorker(PPOConfig(), rank=0, world_size=1, device="cpu").weights_dirty is True
    # an engine holds weights from the start only where it read the checkpoint (load_format not dummy)
    assert "self.holds_weights = read_checkpoint" in inspect.getsource(VLLMRollout.__init__)


def test_a_processor_built_with_a_tokenizer_takes_it_without_loading_another(tiny_model_path, monkeypatch):
    """vLLM builds each multimodal processor with ``tokenizer=`` its own; transformers 5 loaded (and deep-copied)
    a second tokenizer for it, then kept the passed one: after ``reuse_passed_tokenizer`` nothing is loaded."""
    from transformers import AutoProcessor, AutoTokenizer

    from easyrl.workers.rollout import reuse_passed_tokenizer

    path = tiny_model_path("qwen2_5_vl")
    tokenizer = AutoTokenizer.from_pretrained(path)
    reuse_passed_tokenizer()
    reuse_passed_tokenizer()  # idempotent
    loads = []
    load = AutoTokenizer.from_pretrained.__func__
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or load(cls, *a, **k)))
    processor = AutoProcessor.from_pretrained(path, tokenizer=tokenizer, min_pixels=3136, max_pixels=12544)
    assert processor.tokenizer is tokenizer and loads == []
    assert processor.image_processor.size["shortest_edge"] == 3136  # the other kwargs reach the image processor
    assert AutoProcessor.from_pretrained(path).tokenizer is not tokenizer and len(loads) == 1  # without: its own


def test_a_model_with_state_layers_gets_chunked_prefill():
    """vLLM caches the state layers (Mamba, Gated DeltaNet) of a model by prefix only with chunked prefill ("Chunked
    prefill is required for mamba cache mode 'align'"): on for such a model whatever the setting, else the setting's."""
    assert engine_arguments("/m", RolloutConfig(), "cpu", seed=0, vision=False, state_layers=True)[
        "enable_chunked_prefill"] is True
    assert engine_arguments("/m", RolloutConfig(), "cpu", seed=0, vision=False)["enable_chunked_prefill"] is False


def test_a_latent_attention_model_on_the_cpu_in_fp32_gets_vllm_reference_mla_backend():
    """vLLM-CPU prefers its AMX MLA backend where the CPU has AMX tiles, which packs bf16/fp16 weights only; an fp32
    engine of a DeepSeek-style model takes the reference CPU_MLA backend, a bf16 one or an accelerator vLLM's choice."""
    from transformers import DeepseekV3Config, LlamaConfig

    from easyrl.models.families import latent_attention

    assert latent_attention(DeepseekV3Config()) and not latent_attention(LlamaConfig())
    fp32 = engine_arguments("/m", RolloutConfig(dtype="fp32"), "cpu", seed=0, vision=False, mla=True)
    assert fp32["attention_backend"] == "CPU_MLA"
    for config, device in ((RolloutConfig(dtype="bf16"), "cpu"), (RolloutConfig(dtype="fp32"), "cuda")):
        assert "attention_backend" not in engine_arguments("/m", config, device, seed=0, vision=False, mla=True)
    assert "attention_backend" not in engine_arguments("/m", RolloutConfig(dtype="fp32"), "cpu", seed=0, vision=False)


def test_an_attention_chunk_of_part_blocks_gets_cpu_blocks_that_divide_it():
    """vLLM's chunked attention takes whole KV blocks ("attn_chunk_size 32 is not divisible by block_size 128"): on the
    CPU a chunk that is no multiple of the 128-token block gets blocks of gcd(chunk, 128) tokens; Llama 4's released
    8192 keeps vLLM's own, as does an accelerator."""
    from transformers import Llama4TextConfig

    from easyrl.models.families import attention_chunk

    assert attention_chunk(Llama4TextConfig()) == 8192
    assert attention_chunk(Llama4TextConfig(attention_chunk_size=None)) is None
    assert engine_arguments("/m", RolloutConfig(), "cpu", seed=0, vision=False, attention_chunk=32)["block_size"] == 32
    for chunk, device in ((8192, "cpu"), (32, "cuda"), (None, "cpu")):
        assert "block_size" not in engine_arguments("/m", RolloutConfig(), device, seed=0, vision=False,
                                                    attention_chunk=chunk)
