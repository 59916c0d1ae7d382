"""Image/video pad tokens (easyrl.workers.vl_tokens): forbidden in vLLM sampling, typed only in the prompt."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from easyrl.workers.vl_tokens import forbidden_words, mm_token_type_ids, stray_pads, visual_pad_ids

IMG, VID = 151655, 151656


def test_pad_ids_of_vl_and_text_models(tiny_model_path):
    assert visual_pad_ids(AutoConfig.from_pretrained(tiny_model_path("qwen2_5_vl"))) == {IMG: 1, VID: 2}
    assert visual_pad_ids(AutoConfig.from_pretrained(tiny_model_path("qwen2_5"))) == {}


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_forbidden_words_are_the_pad_tokens_and_vllm_maps_them_back_to_their_ids(tiny_model_path, arch):
    from vllm import SamplingParams
    from vllm.tokenizers.registry import get_tokenizer

    path = tiny_model_path(arch)
    hf_config, tokenizer = AutoConfig.from_pretrained(path), get_tokenizer(str(path))  # the engine's tokenizer
    words = forbidden_words(hf_config, tokenizer)
    assert words == ["<|image_pad|>", "<|video_pad|>"]
    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tokenizer)  # what vLLM's input processor does with each request
    assert params._bad_words_token_ids == [[hf_config.image_token_id], [hf_config.video_token_id]]


def test_forbidden_words_refuse_a_mismatched_tokenizer(tiny_model_path):
    hf_config = AutoConfig.from_pretrained(tiny_model_path("qwen2_5_vl"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5_vl"))
    (the,) = tokenizer.encode(" the", add_special_tokens=False)  # byte-level token 'Ġthe': its text is not " the"
    hf_config.image_token_id = the  # a config whose pad id is not a token that encodes to itself
    with pytest.raises(ValueError, match=f"Pad token id {the}"):
        forbidden_words(hf_config, tokenizer)


def test_mm_types_and_stray_pads_only_look_at_their_part():
    # prompt: [pad, vision_start, IMG, IMG, text] | response: [text, IMG, VID, eos]
    ids = torch.tensor([[0, 151652, IMG, IMG, 9, 5, IMG, VID, 151645]])
    types = mm_token_type_ids(ids, prompt_len=5, pad_ids={IMG: 1, VID: 2})
    assert types.tolist() == [[0, 0, 1, 1, 0, 0, 0, 0, 0]]
    stray = stray_pads(ids, prompt_len=5, pad_ids={IMG: 1, VID: 2})
    assert stray.tolist() == [[False] * 6 + [True, True, False]]


def _vl_batch(tiny_path, response: list[int], with_image: bool):
    """One sample: a chat prompt (a 56x56 image, or text only) followed by ``response``, as the trainer builds it."""
    from PIL import Image
    from tensordict import TensorDict
    from transformers import AutoProcessor

    from easyrl.batch import Batch

    processor = AutoProcessor.from_pretrained(tiny_path)
    image_part = "<|vision_start|><|image_pad|><|vision_end|>" if with_image else ""
    text = f"<|im_start|>user\n{image_part}How many sides?<|im_end|>\n<|im_start|>assistant\n"
    images = [Image.new("RGB", (56, 56), (200, 30, 30))] if with_image else None
    encoded = processor(text=[text], images=images, return_tensors="pt")
    prompt = encoded["input_ids"]
    responses = torch.tensor([response])
    input_ids = torch.cat([prompt, responses], dim=1)
    tensors = TensorDict({"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                          "responses": responses, "response_mask": torch.ones_like(responses)}, batch_size=[1])
    mm = {k: v for k, v in encoded.items() if k in ("pixel_values", "image_grid_thw")}
    return Batch(tensors, {"multi_modal_inputs": [mm] if with_image else [{}]})


@pytest.mark.parametrize("padding_free", [True, False])
def test_actor_scores_a_response_containing_an_image_pad(process_group, tiny_model_path, padding_free):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText

    from easyrl.config import ActorConfig, OffloadConfig
    from easyrl.workers.policy import FSDPPolicy

    path = tiny_model_path("qwen2_5_vl")
    config = ActorConfig()
    config.model.model_path = str(path)
    config.fsdp.param_dtype = "fp32"
    config.padding_free = padding_free
    policy = FSDPPolicy(str(path), config, init_device_mesh("cpu", (1,)), "cpu", torch.device("cpu"),
                        trainable=False, offload=OffloadConfig())
    stray, plain = [9707, IMG, 11, 525, 151645], [9707, 40, 11, 525, 151645]

    # with an image in the prompt: before the fix, "Image features and image tokens do not match"
    with_pad = policy.compute_log_probs(_vl_batch(path, stray, True), 1, 1.0)[0]
    without = policy.compute_log_probs(_vl_batch(path, plain, True), 1, 1.0)[0]
    assert torch.isfinite(with_pad).all()
    assert with_pad[0] == without[0]  # tokens before the stray pad see the same prefix
    assert not torch.allclose(with_pad[2:], without[2:])  # later tokens see the pad (not a substitute) before them

    # text-only prompt: transformers embeds the pad as text itself, so the plain model is the reference
    batch = _vl_batch(path, stray, False)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    ids = batch["input_ids"]
    logits = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits
    expected = torch.log_softmax(logits[0, -len(stray) - 1:-1], -1).gather(-1, batch["responses"][0, :, None])[:, 0]
    torch.testing.assert_close(policy.compute_log_probs(batch, 1, 1.0)[0], expected, rtol=1e-5, atol=1e-5)
