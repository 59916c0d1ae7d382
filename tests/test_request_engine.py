"""The request-level engine (``easyrl.workers.request_engine``) on a real in-process vLLM engine (the tiny text model,
no Ray): requests leave as they finish, and an in-flight weight update keeps the requests and tags each token with the
weights that sampled it, whose log-prob it carries."""

from __future__ import annotations

import pytest
import torch

from easyrl.trainer.parity import _engine, vllm_score

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def engine_and_weights(tiny_model_path):
    from transformers import AutoModelForCausalLM

    folder = str(tiny_model_path("qwen2_5"))
    weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the in-process engine, as every worker has
        yield _engine(folder), weights


PROMPT = [1, 17, 29, 101, 7, 64]


def _params(rollout, max_tokens: int, seed: int):
    rollout.config.calculate_log_probs = True
    (prompt, params), = rollout.requests([PROMPT], [[]], seeds=[seed], max_tokens=[max_tokens])
    params.ignore_eos = True  # the lengths are the test's, not the random model's
    return prompt, params


def test_a_short_request_leaves_while_a_long_one_runs_and_slots_are_counted(engine_and_weights):
    rollout, _ = engine_and_weights
    engine = rollout.engine
    for key, budget in (("short", 2), ("long", 12)):
        engine.add(key, *_params(rollout, budget, seed=1))
    first = []
    while not first:
        first = engine.step(slots=2)
    assert [s.key for s in first] == ["short"] and engine.in_flight == 1 and len(first[0].token_ids) == 2
    busy, offered = engine.busy_steps, engine.slot_steps
    (long,) = engine.run(slots=2)
    assert long.key == "long" and len(long.token_ids) == len(long.log_probs) == len(long.versions) == 12
    assert engine.busy_steps - busy < engine.slot_steps - offered  # one slot of two idled after the short one left


def test_an_in_flight_weight_update_keeps_the_request_and_tags_each_token(engine_and_weights):
    rollout, weights = engine_and_weights
    engine = rollout.engine
    prompt, params = _params(rollout, 12, seed=3)
    engine.add("partial", prompt, params)
    for _ in range(6):
        assert not engine.step()
    perturbed = {name: t + 0.05 * torch.randn_like(t) for name, t in weights.items()}
    rollout.load_weights(iter(perturbed.items()), version=1)
    (sample,) = engine.run()
    split = sample.versions.index(1)
    assert 0 < split < 12 and sample.versions == [0] * split + [1] * (12 - split)
    _, new = vllm_score(rollout, PROMPT + sample.token_ids, [])
    new = torch.tensor(new[len(PROMPT) - 1:])
    rollout.load_weights(iter(weights.items()), version=0)
    _, old = vllm_score(rollout, PROMPT + sample.token_ids, [])
    old = torch.tensor(old[len(PROMPT) - 1:])
    sampled = torch.tensor(sample.log_probs)
    # each token's behaviour log-prob is that of the weights that sampled it, given the whole prefix
    assert (sampled[split:] - new[split:]).abs().max() < 1e-4
    assert (sampled[:split] - old[:split]).abs().max() < 1e-4
    assert (new - old).abs().max() > 1e-2  # the two versions differ
