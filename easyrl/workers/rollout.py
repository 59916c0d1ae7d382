"""The rollout engine: one in-process vLLM engine per worker, colocated with the FSDP2 actor.

Per step: ``wake_up(weights) -> load_weights -> wake_up(kv_cache) -> generate -> sleep``. On GPUs/NPUs the engine
sleeps at level 2 (weights dropped); vLLM's CPU backend has no sleep mode, so there the engine stays resident.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable
from typing import Any, Optional

import torch
from tqdm import tqdm

from easyrl import envvars
from easyrl.config import RolloutConfig
from easyrl.config.role import DTYPES
from easyrl.models.expert_layout import to_checkpoint_layout
from easyrl.models.families import attention_chunk, latent_attention
from easyrl.quiet import verbose
from easyrl.workers import vllm_compat
from easyrl.workers.dummy_load import DUMMY_LOAD_FORMAT, load_format, register_dummy_loader
from easyrl.workers.request_engine import RequestEngine
from easyrl.workers.routing_capture import start_capture, take_routing
from easyrl.workers.vl_tokens import forbidden_words
from easyrl.workers.vllm_cpu_fixes import flatten_cpu_rotary_heads
from easyrl.workers.weight_sync import reload_and_report, sleep_level

logger = logging.getLogger("easyrl.rollout")
CPU_BLOCK_SIZE = 128  # tokens: vLLM-CPU's KV block where none is asked for (``CpuPlatform.check_and_update_config``)


def engine_arguments(model_path: str, config: RolloutConfig, device: str, seed: int, vision: bool,
                     read_checkpoint: bool = False, record_routing: bool = False,
                     state_layers: bool = False, mla: bool = False,
                     attention_chunk: Optional[int] = None) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of the colocated engine (a pure function of the settings):
    ``load_format="easyrl_dummy"`` where ``dummy_load.load_format`` allows it and the engine is synced before use
    (not ``read_checkpoint``: then vLLM reads ``model_path``'s weights); on GPU/NPU
    ``disable_custom_all_reduce=True`` (Ray shows each worker one device), ``gpu_memory_utilization`` and sleep mode;
    with TP > 1 the ``external_launcher`` executor; ``record_routing`` off the CPU: ``enable_return_routed_experts``
    (routing replay; the CPU's is captured, ``easyrl.workers.routing_capture``); ``state_layers`` (a model with
    state layers, ``vllm_compat.has_state_layers``): chunked prefill on, which vLLM requires of such a model with
    prefix caching; ``mla`` (``families.latent_attention``) on the CPU in fp32: vLLM's reference ``CPU_MLA``
    attention, not its bf16-only AMX one; ``attention_chunk`` (tokens, Llama 4's ``attention_chunk_size``) on the CPU
    and not a multiple of its 128-token KV block: blocks of ``gcd(chunk, 128)`` tokens (vLLM's chunked attention takes
    whole blocks). Why each: docs/vllm-versions.md."""
    max_model_len = config.max_model_len
    engine_kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=DTYPES[config.dtype].torch_name,
        seed=seed,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(config.max_num_batched_tokens, max_model_len),
        enforce_eager=config.enforce_eager,
        enable_chunked_prefill=config.enable_chunked_prefill or state_layers,
        trust_remote_code=config.trust_remote_code,
        limit_mm_per_prompt={"image": config.limit_images, "video": config.limit_videos},
        disable_log_stats=True,
        use_tqdm_on_load=verbose(),  # no checkpoint-loading bar per engine (easyrl.quiet; EASYRL_VERBOSE=1 shows it)
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",  # log-probs of the distribution sampled from (after top-k/p)
        **vllm_compat.weight_transfer_kwargs(),  # vLLM 0.23: the native weight-update calls' in-process backend
    )
    if config.tensor_parallel_size > 1:
        engine_kwargs.update(tensor_parallel_size=config.tensor_parallel_size,
                             distributed_executor_backend="external_launcher")
    if vision:
        # the data's image bounds also bound vLLM's start-up profiling (else its dummy image is the largest)
        engine_kwargs["mm_processor_kwargs"] = {"min_pixels": config.min_pixels, "max_pixels": config.max_pixels}
        # no processed-image cache: an RL run sees each image once an epoch, the cache only grows host memory
        engine_kwargs["mm_processor_cache_gb"] = 0
    if not read_checkpoint and (fmt := load_format(device, vllm_compat.vllm_version())) is not None:
        engine_kwargs["load_format"] = fmt
    if attention_chunk and device == "cpu" and attention_chunk % CPU_BLOCK_SIZE:
        engine_kwargs["block_size"] = math.gcd(attention_chunk, CPU_BLOCK_SIZE)
    if mla and device == "cpu" and config.dtype == "fp32":
        engine_kwargs["attention_backend"] = "CPU_MLA"
    if record_routing and device != "cpu":
        engine_kwargs["enable_return_routed_experts"] = True
    if device != "cpu":
        engine_kwargs.update(gpu_memory_utilization=config.gpu_memory_utilization, enable_sleep_mode=True,
                             disable_custom_all_reduce=True)
    if device == "cuda" and config.tensor_parallel_size > 1:
        # the all-reduce + RMSNorm fusion maps peers' GPU memory, which a one-GPU Ray actor may fail to do: hang
        engine_kwargs["compilation_config"] = {"pass_config": {"fuse_allreduce_rms": False}}
    return engine_kwargs


_PASSED_TOKENIZER = threading.local()


def reuse_passed_tokenizer() -> None:
    """Make a processor built with ``tokenizer=`` take that tokenizer instead of loading one of its own (idempotent).
    Without this, ``ProcessorMixin.from_pretrained(path, tokenizer=t)`` loads (and deep-copies) a second tokenizer
    only to replace it by ``t``: 15-20 s per vLLM engine start for Qwen's vocabulary."""
    from transformers.processing_utils import ProcessorMixin

    load = getattr(ProcessorMixin, "_load_tokenizer_from_pretrained", None)
    if load is None or getattr(ProcessorMixin.from_pretrained, "reuses_tokenizer", False):
        return
    load, from_pretrained = load.__func__, ProcessorMixin.from_pretrained.__func__

    def load_tokenizer(cls, sub_processor_type, *args, **kwargs):
        passed = getattr(_PASSED_TOKENIZER, "value", None)
        if passed is not None and sub_processor_type == "tokenizer":
            return passed
        return load(cls, sub_processor_type, *args, **kwargs)

    def from_pretrained_reusing(cls, *args, tokenizer=None, **kwargs):
        _PASSED_TOKENIZER.value = tokenizer
        try:
            return from_pretrained(cls, *args, **kwargs)
        finally:
            _PASSED_TOKENIZER.value = None

    from_pretrained_reusing.reuses_tokenizer = True
    ProcessorMixin._load_tokenizer_from_pretrained = classmethod(load_tokenizer)
    ProcessorMixin.from_pretrained = classmethod(from_pretrained_reusing)


class VLLMRollout:
    """A vLLM ``LLM`` engine for sampling rollouts with the current actor weights. ``seed`` differs per engine and is
    the same on every rank of one tensor-parallel engine. With TP > 1 every rank of the TP group builds the engine at
    once over the worker's process group, and must make every call with the same arguments. ``read_checkpoint``: the
    engine holds ``model_path``'s weights from the start (else it is synced before first use); ``record_routing``:
    each finished request carries the experts its MoE routers chose (routing replay, R3)."""

    def __init__(self, model_path: str, config: RolloutConfig, device: str, seed: int, read_checkpoint: bool = False,
                 record_routing: bool = False):
        from transformers import AutoConfig
        from vllm import LLM

        self.config = config
        self.device = device
        self.sleep_level = sleep_level(device)
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=config.trust_remote_code)
        self.model_type = hf_config.model_type
        state_layers = any(vllm_compat.has_state_layers(name) for name in hf_config.architectures or ())
        if state_layers and not config.enable_chunked_prefill:
            logger.info("worker.rollout.enable_chunked_prefill: on for %s, whose state layers vLLM caches by prefix "
                        "only with chunked prefill", self.model_type)
        engine_kwargs = engine_arguments(model_path, config, device, seed,
                                         vision=getattr(hf_config, "vision_config", None) is not None,
                                         read_checkpoint=read_checkpoint, record_routing=record_routing,
                                         state_layers=state_layers, mla=latent_attention(hf_config),
                                         attention_chunk=attention_chunk(hf_config))
        if device == "cpu" and envvars.cpu_kvcache_gib(os.environ) is None:
            # vLLM's CPU backend sizes its KV cache from this variable (GiB), not from gpu_memory_utilization; one
            # set in the environment or worker.env_vars wins (logged by the pre-flight, easyrl.envvars.overrides)
            os.environ[envvars.CPU_KVCACHE] = str(max(1, math.ceil(config.cpu_kvcache_space_gib)))
        if engine_kwargs.get("load_format") == DUMMY_LOAD_FORMAT:
            register_dummy_loader()  # in this process, before the engine is built
        reuse_passed_tokenizer()
        flatten_cpu_rotary_heads(device)
        self.llm = LLM(**engine_kwargs)
        vllm_compat.keep_transformers_classes_callable()  # the colocated actor's model still runs (OLMo 2, ...)
        self.record_routing = record_routing
        routing = None
        if record_routing and device == "cpu":  # vLLM's CPU runner returns no routing: easyrl captures it
            self.llm.collective_rpc(start_capture)
            routing = lambda ids: self.llm.collective_rpc(take_routing, args=(ids,))[0]  # noqa: E731
        self.engine = RequestEngine(self.llm, routing=routing)  # request by request (continuous batching)
        # a sampled image/video pad id in a response would break the actor's next forward: never sample one
        self.bad_words = forbidden_words(hf_config, self.llm.get_tokenizer())
        self.is_asleep = False
        # else the actor's weights are synced before first use (safe for load_format="dummy")
        self.holds_weights = read_checkpoint
        if not read_checkpoint:  # asleep until the first sync (a level-2 sleep would drop the checkpoint's weights)
            self.sleep()

    def sleep(self) -> None:
        """Free the engine's device memory (weights and KV cache) while the actor trains. No-op on the CPU."""
        if self.sleep_level is not None and not self.is_asleep:
            self.llm.sleep(level=self.sleep_level)
            self.is_asleep = True
            self.holds_weights = self.holds_weights and self.sleep_level < 2  # level 2 drops the weights

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Re-allocate ``tags`` (``weights``, ``kv_cache``; None = all). No-op on the CPU."""
        if self.sleep_level is not None and self.is_asleep:
            vllm_compat.wake_up(self.llm, tags)
            self.is_asleep = tags is not None and "kv_cache" not in tags

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                     version: Optional[int] = None) -> tuple[list[str], list[str]]:
        """Overwrite the engine's weights in place with Hugging Face-named full tensors (no disk, no re-init), then
        drop every cache computed with the old weights, the KV cache of requests in flight included
        (``RequestEngine.reload``: their later tokens are tagged ``version``; None keeps the engine's). The iterator
        is consumed inside, so it may gather lazily; with TP every rank passes the full tensors and vLLM keeps its
        slice. Returns ``(expected, loaded)``: vLLM's parameter names, and those the tensors wrote."""
        weights = to_checkpoint_layout(named_tensors, self.model_type)
        (expected, loaded), = self.llm.collective_rpc(reload_and_report,
                                                      kwargs=dict(weights_iterator=weights, device=self.device))
        self.holds_weights = True
        # every cache computed with the old weights is stale (else "Encoder cache miss" on the next image prompt)
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()
        self.engine.reload(self.engine.version if version is None else version)
        return expected, loaded

    def requests(self, raw_prompt_ids: list[list[int]], images: list[list[Any]],
                 overrides: Optional[dict[str, Any]] = None, seeds: Optional[list[int]] = None,
                 max_tokens: Optional[list[int]] = None, videos: Optional[list[list[Any]]] = None,
                 ) -> list[tuple[dict[str, Any], Any]]:
        """One ``(prompt, SamplingParams)`` per request: ``raw_prompt_ids`` are chat-templated (one
        ``<|image_pad|>`` per image, one ``<|video_pad|>`` per video); ``overrides`` replace ``temperature`` /
        ``top_p`` / ``top_k``; ``seeds`` and ``max_tokens`` (tokens) are per request (None: the engine's seed,
        ``response_length``)."""
        from vllm import SamplingParams

        n = len(raw_prompt_ids)
        prompts = [_request(*item) for item in zip(raw_prompt_ids, images, videos or [[]] * n)]
        settings = dict(temperature=self.config.temperature, top_p=self.config.top_p, top_k=self.config.top_k)
        settings.update({k: v for k, v in (overrides or {}).items() if k in settings})
        logprobs = 0 if self.config.calculate_log_probs else None
        params = [SamplingParams(n=1, max_tokens=budget, logprobs=logprobs, detokenize=False,
                                 bad_words=self.bad_words or None, seed=seed, **settings)
                  for seed, budget in zip(seeds if seeds is not None else [None] * n,
                                          max_tokens if max_tokens is not None else [self.config.response_length] * n)]
        return list(zip(prompts, params))

    def generate(self, raw_prompt_ids: list[list[int]], images: list[list[Any]],
                 overrides: Optional[dict[str, Any]] = None, seeds: Optional[list[int]] = None,
                 max_tokens: Optional[list[int]] = None, videos: Optional[list[list[Any]]] = None,
                 ) -> tuple[list[list[int]], Optional[list[list[float]]], Optional[list[Any]]]:
        """Sample one response per request (arguments: :meth:`requests`), all admitted at once to the request-level
        engine and collected as they finish. Returns ``(response_ids, response_log_probs, routed_experts)`` in
        request order: the sampled tokens (EOS included when generation stopped on it), vLLM's log-prob of each
        (None unless ``calculate_log_probs``), and the experts routed to at each position of prompt + response
        (``Finished.routed_experts``; None unless ``record_routing``)."""
        requests = self.requests(raw_prompt_ids, images, overrides, seeds, max_tokens, videos)
        for i, (prompt, params) in enumerate(requests):
            self.engine.add(i, prompt, params)
        progress = None if self.config.disable_tqdm else tqdm(total=len(requests), desc="Processed prompts")
        done = sorted(self.engine.run(slots=len(requests), progress=progress), key=lambda sample: sample.key)
        response_ids = [sample.token_ids for sample in done]
        routed = [sample.routed_experts for sample in done] if self.record_routing else None
        if not self.config.calculate_log_probs:
            return response_ids, None, routed
        return response_ids, [sample.log_probs for sample in done], routed


def _request(token_ids: list[int], images: list[Any], videos: Optional[list[Any]]) -> dict[str, Any]:
    """One vLLM prompt: the token ids and, if any, ``multi_modal_data`` with the PIL images and the videos as
    ``(frames (T, H, W, 3) uint8, metadata)`` pairs (``Video.vllm_item``: already sampled, frame sampling off)."""
    request: dict[str, Any] = {"prompt_token_ids": list(token_ids)}
    data: dict[str, Any] = {}
    if images:
        data["image"] = list(images)
    if videos:
        data["video"] = [video.vllm_item() for video in videos]
    if data:
        request["multi_modal_data"] = data
    return request
