"""The discriminative reward model (``worker.reward.reward_model``), without Ray: its config, the templating of
(prompt, response) with the reward model's own chat template, the mixing into the rule reward, the FSDP2 role on a
one-rank process group against a direct ``transformers`` call, the rule reward of a run scored by the model alone, and
the memory estimate. The run on Ray with vLLM: ``tests/test_e2e_reward_model.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer
from easyrl.testing.tiny_reward_model import build_tiny_reward_model

REPO = Path(__file__).resolve().parents[1]
BASE = [f"config={REPO / 'config.yaml'}", "worker.actor.model.model_path=m"]


@pytest.fixture(scope="module")
def rm_path() -> Path:
    return build_tiny_reward_model()


@pytest.fixture(scope="module")
def rm_tokenizer(rm_path):
    return load_tokenizer(load_config(BASE + [f"worker.reward.reward_model.model_path={rm_path}"])
                          .worker.reward.reward_model)


def test_config_is_off_by_default_and_held_in_the_actors_compute_dtype():
    rm = load_config(BASE).worker.reward.reward_model
    assert not rm.enabled and rm.model_path is None and rm.weight == 1.0 and rm.offload.offload_params
    rm = load_config(BASE + ["worker.reward.reward_model.model_path=rm", "worker.reward.reward_model.weight=0.5",
                             "worker.actor.fsdp.param_dtype=fp32"]).worker.reward.reward_model
    assert rm.enabled and rm.weight == 0.5 and rm.param_dtype == "fp32"


def test_inputs_are_templated_with_the_reward_models_template_and_right_padded(rm_tokenizer):
    responses = ["4", "Hello there, how are you today, friend?"]
    encoded = encode_conversations(rm_tokenizer, ["What is 2+2?", "Hi"], responses)
    assert encoded.texts[0] == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    assert "system" not in encoded.texts[1]  # the policy's template would add a system turn; the RM's does not
    lengths = encoded.attention_mask.sum(-1)
    assert lengths[0] < lengths[1] == encoded.input_ids.shape[1]
    direct = rm_tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"},
                                               {"role": "assistant", "content": "4"}], tokenize=True)
    direct = direct["input_ids"] if not isinstance(direct, list) else direct
    assert encoded.input_ids[0, :lengths[0]].tolist() == list(direct)
    assert (encoded.input_ids[0, lengths[0]:] == rm_tokenizer.pad_token_id).all() and encoded.truncated == 0


def test_a_chat_template_override_and_max_length_keep_the_end(rm_tokenizer):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    full = encode_conversations(rm_tokenizer, ["a b c d e f"], ["g h i"], chat_template=template)
    assert full.texts == ["[user] a b c d e f\n[assistant] g h i\n"]
    cut = encode_conversations(rm_tokenizer, ["a b c d e f"], ["g h i"], chat_template=template, max_length=5)
    assert cut.truncated == 1 and cut.input_ids.shape == (1, 5)
    assert cut.input_ids[0].tolist() == full.input_ids[0, -5:].tolist()


def test_mixing_adds_the_weighted_score_on_the_last_response_token():
    from tensordict import TensorDict

    from easyrl.trainer.scoring import add_model_scores

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rule = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    batch = Batch(TensorDict({"response_mask": mask, "token_level_scores": rule}, batch_size=[2]),
                  {"score/overall": [1.0, 0.0]})
    add_model_scores(batch, "reward_model", torch.tensor([2.0, -4.0]), weight=0.5)
    assert batch["score/reward_model"] == [2.0, -4.0]
    assert batch["score/overall"] == [2.0, -2.0]
    assert torch.equal(batch["token_level_scores"], torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, -2.0]]))


@pytest.mark.parametrize("dynamic", [True, False])
def test_the_sharded_reward_model_equals_a_direct_transformers_call(process_group, rm_path, rm_tokenizer, dynamic):
    from tensordict import TensorDict
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForSequenceClassification

    from easyrl.workers.reward_model import FSDPRewardModel

    config = load_config(BASE + [f"worker.reward.reward_model.model_path={rm_path}",
                                 "worker.actor.fsdp.param_dtype=fp32",
                                 "worker.reward.reward_model.micro_batch_size_per_device=2",
                                 f"worker.reward.reward_model.dynamic_batching={str(dynamic).lower()}"])
    rm = config.worker.reward.reward_model
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    model = FSDPRewardModel(rm, mesh, "cpu", torch.device("cpu"), rm_tokenizer.pad_token_id)
    prompts = ["What is 2+2?", "Name a color.", "Count to three.", "Say hi"]
    responses = ["4", "Blue, or maybe green, it depends on the sky.", "one two three", ""]
    encoded = encode_conversations(rm_tokenizer, prompts, responses)
    data = Batch(TensorDict({"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask},
                            batch_size=[4]))
    scores = model.compute_scores(data)
    direct = AutoModelForSequenceClassification.from_pretrained(rm_path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.stack([direct(**rm_tokenizer(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0]
                                for text in encoded.texts])
    assert scores.shape == (4,) and scores.dtype == torch.float32
    assert torch.allclose(scores, expected, atol=1e-5, rtol=0), (scores, expected)
    assert scores.std() > 1e-3  # the samples score differently


def test_without_a_reward_function_the_rule_reward_is_zero(rm_path):
    from easyrl.trainer.reward_checks import load_reward

    config = load_config(BASE + ["worker.reward.reward_function=null",
                                 f"worker.reward.reward_model.model_path={rm_path}"])
    reward_fn = load_reward(config.worker.reward)
    assert reward_fn([{"response": "x", "response_length": 1, "ground_truth": "1"}] * 2)["overall"] == [0.0, 0.0]


def test_the_memory_estimate_counts_a_resident_reward_model(rm_path):
    from easyrl.sizing.anatomy import GIB
    from easyrl.sizing.estimate import estimate_memory
    from easyrl.sizing.experience import experience_models

    words = BASE + [f"worker.reward.reward_model.model_path={rm_path}", "worker.actor.fsdp.param_dtype=fp32"]
    params = experience_models(load_config(words))["reward_model"].params
    assert 39_000_000 < params < 41_000_000  # the 151936 x 256 embedding and two layers
    resident = load_config(words + ["worker.reward.reward_model.offload.offload_params=false"])
    e = estimate_memory(7_000_000_000, 152_000, resident, 80.0, reward_model_params=params)
    share = 4 * params / resident.world_size / GIB
    assert e.rollout["reward model"] == e.training["reward model"] == pytest.approx(share)
    offloaded = estimate_memory(7_000_000_000, 152_000, load_config(words), 80.0, reward_model_params=params)
    assert offloaded.training["reward model"] == 0.0
