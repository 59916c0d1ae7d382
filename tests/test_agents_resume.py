"""Exact resume with the multi-turn rollout, without Ray: the real prompt stream (``PromptStream``, whose position a
checkpoint saves), the real ``Generator.prompt_batch`` (per-sample seeds from the step) and the real
``MultiTurnRollout`` (tool process pool, scheduler, per-turn seeds) over an engine whose tokens follow the request's
seed. A run stopped after step 2 and resumed from the saved position (a fresh rollout and tool pool) sends the
engines the same requests and gets the same trajectories at steps 3-4 as an uninterrupted run: the multi-turn
rollout carries no state from one step to the next (tools and the environment hook are functions of their inputs,
docs/agents.md)."""

from __future__ import annotations

from pathlib import Path

import torch

from easyrl.config import PPOConfig

HERE = Path(__file__).parent / "agent_tools"
PROMPTS = [[5 + i, 6 + i, 7 + i][: 1 + i % 3] for i in range(10)]


class SeededWorkers:
    """Two engines that answer each request with an ``echo`` call naming its seed, then ``<|im_end|>`` (cut to its
    ``max_tokens``); records the requests."""

    rollout_dp_size = 2

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.requests = []

    def _ids(self, seed: int, max_tokens: int) -> list[int]:
        call = f'<tool_call>{{"name": "echo", "arguments": {{"text": "{seed % 997}"}}}}</tool_call>'
        return (self.tokenizer.encode(call, add_special_tokens=False) + [self.end])[:max_tokens]

    def run_rollout(self, method, batch, **kwargs):
        self.requests += [(tuple(ids), seed, budget) for ids, seed, budget in zip(
            batch["raw_prompt_ids"], batch["rollout_seed"], batch["max_tokens"]) if budget > 1]  # not the padding
        return [{"response_ids": [self._ids(s, m) for s, m in zip(share["rollout_seed"], share["max_tokens"])],
                 "response_log_probs": None, "timing_s/reshard": 0.0, "busy": 0, "offered": 0}
                for share in batch.chunk(self.rollout_dp_size)]

    def run_all(self, method):
        pass


def _stream():
    from easyrl.data.loader import PromptStream

    def collate(items):
        return {"prompt_ids": list(items), "raw_prompt_ids": list(items)}

    return PromptStream(PROMPTS, 3, shuffle=True, seed=1, collate_fn=collate)


def _steps(config, tokenizer, stream, steps):
    """Run ``steps`` (step numbers) of prompts -> multi-turn trajectories; the engine requests and the batches."""
    from easyrl.trainer.generation import Generator
    from easyrl.trainer.multi_turn import MultiTurnRollout

    workers = SeededWorkers(tokenizer)
    rollout = MultiTurnRollout(workers, config, tokenizer, pad_id=0)  # a fresh tool pool
    generator = Generator(config, rollout, scorer=None, pad_id=0)
    batches = iter(stream)
    out = []
    try:
        for step in steps:
            workers.requests = []
            batch, _ = rollout.generate(generator.prompt_batch(next(batches), 2, step), None)
            out.append((workers.requests, batch["responses"], batch["response_mask"], batch["tool_calls"]))
    finally:
        rollout.close()
    return out


def test_a_resumed_multi_turn_run_makes_the_same_requests_and_trajectories(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))
    config = PPOConfig()
    config.data.max_prompt_length, config.data.max_response_length = 4, 96
    mt = config.worker.rollout.multi_turn
    mt.enable, mt.tools, mt.max_assistant_turns, mt.num_tool_workers = True, [f"{HERE / 'tools.py'}:echo"], 3, 1
    mt.patience = 0.25  # rounds: the scripted workers answer generate_sequences (by request: the e2e multi-turn test)

    uninterrupted = _steps(config, tokenizer, _stream(), [1, 2, 3, 4])
    first = _stream()
    _steps(config, tokenizer, first, [1, 2])
    state = first.state_dict()  # what the checkpoint keeps of the data
    resumed = _stream()
    resumed.load_state_dict(state)
    after = _steps(config, tokenizer, resumed, [3, 4])

    for (requests, responses, mask, calls), (ref_requests, ref_responses, ref_mask, ref_calls) in zip(
            after, uninterrupted[2:]):
        # the same requests (prompt + turns so far, seed, budget); which round each rode in depends on the tools'
        # timing (easyrl.agents.scheduler), so they are compared as a set
        assert sorted(requests) == sorted(ref_requests)
        assert torch.equal(responses, ref_responses) and torch.equal(mask, ref_mask) and calls == ref_calls
    # the check has teeth: steps differ, and each trajectory's turns drew different seeds
    assert not torch.equal(uninterrupted[2][1], uninterrupted[3][1])
    first_prompt = uninterrupted[2][0][0][0][:1]
    seeds = [seed for ids, seed, _ in uninterrupted[2][0] if ids[:1] == first_prompt]
    assert len(seeds) == len(set(seeds)) == 2 * 3  # the prompt's 2 samples x 3 turns, each its own seed
    assert [len(c) for c in uninterrupted[2][3]] == [2] * 6  # 3 turns, 2 tool calls each
