"""Tiny random-weight models of vision-language families beyond Qwen, for the parity tests (``easyrl.testing.tiny``
builds the Qwen ones).

Each is the real transformers class at a small size: 2 text layers of width 256 (4 heads of dim 64, 2 KV heads: vLLM's
CPU backend refuses head dim 16), a 2-layer vision tower of width 64, random weights, the Qwen2.5 vocabulary
(``easyrl.testing.tokenizer``) with the family's image special tokens added after it (ids from 151669: the released
tokenizers are not shipped by any package) and its processor sized to the tiny tower. A ChatML template renders an image
item as the placeholder the family's processor (and vLLM's) expands.

Usage: ``build_tiny_vl("internvl")`` (``TINY_VL_ARCHS``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from easyrl.testing.cache import build_atomically
from easyrl.testing.tiny import _TEXT, BOS_ID, EOS_IDS, MARKER_FILE, PAD_ID, default_tiny_model_dir
from easyrl.testing.tokenizer import build_qwen_tokenizer

FIRST_FREE_ID = 151669  # the first id after Qwen's added tokens (the embedding has 151936 rows)
BUILD_VERSION = 1
_TEXT_64 = dict(_TEXT, head_dim=64)
_VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)


def chat_template(image: str) -> str:
    """ChatML (Qwen2.5's, without the default system message) where an image item renders as ``image``."""
    return ("{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
            "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
            "{%- for item in message['content'] -%}"
            "{%- if item['type'] == 'image' or 'image' in item -%}{{- '" + image + "' -}}"
            "{%- elif 'text' in item -%}{{- item['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
            "{{- '<|im_end|>\\n' -}}{%- endfor -%}"
            "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def _tokenizer(tokens: list[str], named: dict[str, str] | None, template: str):
    """The Qwen2.5 tokenizer with ``tokens`` added as special tokens at ids ``FIRST_FREE_ID, ...``; ``named``: the
    model-specific attributes some processors read (``tokenizer.start_image_token``, ...)."""
    from tokenizers import AddedToken

    tokenizer = build_qwen_tokenizer(template)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in tokens], special_tokens=True)
    if named:
        tokenizer._set_model_specific_special_tokens(special_tokens=named)
    return tokenizer


def _internvl():
    """InternVL 3 in transformers' own format (``InternVLForConditionalGeneration``, a Qwen2 text model; vLLM serves
    it with its InternS1 class): 64x64 tiles of 16x16 patches, pixel-shuffled to 4 tokens per tile, up to 4 tiles plus
    a thumbnail."""
    import transformers as T

    template = chat_template("<IMG_CONTEXT>")
    tokenizer = _tokenizer(["<img>", "</img>", "<IMG_CONTEXT>"], {
        "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<IMG_CONTEXT>"}, template)
    config = T.InternVLConfig(text_config=dict(_TEXT_64, model_type="qwen2"),
                              vision_config=dict(_VISION, image_size=[64, 64], patch_size=[16, 16]),
                              image_token_id=FIRST_FREE_ID + 2, image_seq_length=4, downsample_ratio=0.5,
                              tie_word_embeddings=False)
    images = T.GotOcr2ImageProcessor(size={"height": 64, "width": 64}, crop_to_patches=True, min_patches=1,
                                     max_patches=4)
    processor = T.InternVLProcessor(images, tokenizer, T.InternVLVideoProcessor(), image_seq_length=4,
                                    chat_template=template)
    return config, processor


def _idefics3():
    """Idefics3 (a Llama text model, a SigLIP tower): images split into 64x64 tiles plus a global one, 16x16 patches
    pixel-shuffled (scale 2) to 4 tokens per tile."""
    import transformers as T

    template = chat_template("<image>")
    rows = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tokenizer = _tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *rows],
                           None, template)
    config = T.Idefics3Config(text_config=dict(_TEXT_64, model_type="llama"),
                              vision_config=dict(_VISION, image_size=64, patch_size=16),
                              image_token_id=FIRST_FREE_ID + 1, scale_factor=2, pad_token_id=PAD_ID,
                              tie_word_embeddings=False)
    images = T.Idefics3ImageProcessor(size={"longest_edge": 128}, max_image_size={"longest_edge": 64},
                                      do_image_splitting=True)
    return config, T.Idefics3Processor(images, tokenizer, image_seq_len=4, chat_template=template)


def _mistral3():
    """Mistral 3 (Mistral Small 3.1: a Mistral text model, a Pixtral tower with 2-D rotary positions): images up to
    128 pixels on their longer side, 16x16 patches merged 2x2 into one token, ``[IMG_BREAK]`` after each row."""
    import transformers as T

    template = chat_template("[IMG]")
    tokenizer = _tokenizer(["[IMG]", "[IMG_BREAK]", "[IMG_END]"], None, template)
    config = T.Mistral3Config(text_config=dict(_TEXT_64, model_type="mistral", sliding_window=None),
                              vision_config=dict(_VISION, image_size=128, patch_size=16, head_dim=32),
                              image_token_index=FIRST_FREE_ID, spatial_merge_size=2, tie_word_embeddings=False)
    images = T.PixtralImageProcessor(size={"longest_edge": 128}, patch_size=16)
    return config, T.PixtralProcessor(images, tokenizer, patch_size=16, spatial_merge_size=2, chat_template=template)


def _llava_onevision():
    """LLaVA-OneVision (a Qwen2 text model, a SigLIP tower): "anyres" images, a 64x64 base tile plus the tiles of the
    best-fitting grid (up to 128x128), 16x16 patches (16 tokens per tile), a newline token after each row of the
    unpadded tiles' features."""
    import transformers as T

    template = chat_template("<image>")
    tokenizer = _tokenizer(["<image>", "<video>"], None, template)
    grid = [[64, 64], [64, 128], [128, 64], [128, 128]]
    config = T.LlavaOnevisionConfig(text_config=dict(_TEXT_64, model_type="qwen2"),
                                    vision_config=dict(_VISION, image_size=64, patch_size=16,
                                                       model_type="siglip_vision_model", vision_use_head=False),
                                    image_token_index=FIRST_FREE_ID, video_token_index=FIRST_FREE_ID + 1,
                                    image_grid_pinpoints=grid, tie_word_embeddings=False)
    images = T.LlavaOnevisionImageProcessor(size={"height": 64, "width": 64}, image_grid_pinpoints=grid)
    return config, T.LlavaOnevisionProcessor(images, tokenizer, T.LlavaOnevisionVideoProcessor(), num_image_tokens=16,
                                             vision_feature_select_strategy="full", chat_template=template)


def _glm4v():
    """GLM-4.1V (Qwen-VL-like: flattened 14x14 patches merged 2x2, ``image_grid_thw``, 3-D rotary positions on a
    half-rotary head: ``sum(mrope_section) = 64 * 0.5 / 2``)."""
    import transformers as T

    template = chat_template("<|begin_of_image|><|image|><|end_of_image|>")
    tokenizer = _tokenizer(["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>",
                            "<|end_of_video|>", "<|video|>"], None, template)
    text = {k: v for k, v in _TEXT.items() if k not in ("bos_token_id", "eos_token_id")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6],
                               "partial_rotary_factor": 0.5}
    text["attention_bias"] = True  # as released; transformers' attention has q/k/v biases whatever the config says,
    # vLLM builds them only where it says so (easyrl.models.twin.RELEASED)
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, image_size=56)
    ids = ("image_start_token_id", "image_end_token_id", "image_token_id", "video_start_token_id",
           "video_end_token_id", "video_token_id")
    config = T.Glm4vConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                           **{key: FIRST_FREE_ID + i for i, key in enumerate(ids)})
    images = T.Glm4vImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2,
                                   size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64})
    return config, T.Glm4vProcessor(images, tokenizer, T.Glm4vVideoProcessor(), chat_template=template)


@dataclass(frozen=True)
class _Arch:
    build: Callable[[], tuple[Any, Any]]  # -> (transformers config, processor)
    model_class: str  # attribute of `transformers`


_ARCHS = {
    "internvl": _Arch(_internvl, "InternVLForConditionalGeneration"),
    "idefics3": _Arch(_idefics3, "Idefics3ForConditionalGeneration"),
    "mistral3": _Arch(_mistral3, "Mistral3ForConditionalGeneration"),
    "llava_onevision": _Arch(_llava_onevision, "LlavaOnevisionForConditionalGeneration"),
}
TINY_VL_ARCHS = tuple(_ARCHS)


def _write(arch: str, out: Path, seed: int) -> None:
    import transformers
    from transformers import GenerationConfig

    config, processor = _ARCHS[arch].build()
    torch.manual_seed(seed)
    getattr(transformers, _ARCHS[arch].model_class)._from_config(config, dtype=torch.float32).save_pretrained(out)
    processor.save_pretrained(out)  # the tokenizer files too
    processor.tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_IDS, pad_token_id=PAD_ID).save_pretrained(out)
    (out / MARKER_FILE).write_text(json.dumps({"arch": arch, "version": BUILD_VERSION, "seed": seed}))


def build_tiny_vl(arch: str, output_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) the tiny random-weight ``arch`` (one of ``TINY_VL_ARCHS``) and return its folder: fp32
    ``model.safetensors``, ``config.json``, tokenizer and processor files with the chat template,
    ``generation_config.json``; loadable by ``AutoModelForImageTextToText``/``AutoProcessor`` and by vLLM.
    Concurrent builds are safe (``build_atomically``).

    Raises:
        ValueError: ``arch`` is unknown.
    """
    if arch not in _ARCHS:
        raise ValueError(f"unknown tiny VL arch {arch!r}; choose one of {', '.join(TINY_VL_ARCHS)}")
    final = Path(output_dir) if output_dir is not None else default_tiny_model_dir(arch)

    def complete(path: Path) -> bool:
        try:
            marker = json.loads((path / MARKER_FILE).read_text())
        except (OSError, ValueError):
            return False
        return marker.get("arch") == arch and marker.get("version") == BUILD_VERSION

    return build_atomically(final, complete, lambda tmp: _write(arch, tmp, seed))
