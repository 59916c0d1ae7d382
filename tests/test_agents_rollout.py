"""``MultiTurnRollout`` over a scripted worker group (the engines' side is tests/test_e2e_multi_turn.py): rounds
batched over the engines (padded to a multiple of them), per-round seeds and token budgets, engines kept awake
between rounds and put to sleep once, and the trajectory batch layout of ``easyrl.trainer.rollout``."""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import PPOConfig

HERE = Path(__file__).parent / "agent_tools"


class ScriptedWorkers:
    """Two engines that answer every request with one Hermes call of ``echo`` and ``<|im_end|>``, cut to its
    ``max_tokens``; records the calls."""

    rollout_dp_size = 2

    def __init__(self, tokenizer):
        call = '<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>'
        self.ids = tokenizer.encode(call, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.rounds, self.slept = [], 0

    def run_rollout(self, method, batch, **kwargs):
        assert method.__name__ == "generate_sequences" and kwargs["keep_awake"] is True
        self.rounds.append(batch)
        return [{"response_ids": [self.ids[:m] for m in share["max_tokens"]],
                 "response_log_probs": [[-1.0] * len(self.ids[:m]) for m in share["max_tokens"]],
                 "timing_s/reshard": 0.5 if len(self.rounds) == 1 else 0.0, "busy": 0, "offered": 0}
                for share in batch.chunk(self.rollout_dp_size)]

    def run_all(self, method):
        assert method.__name__ == "sleep_rollout"
        self.slept += 1


def test_rounds_padding_seeds_budget_and_batch_layout(tiny_model_path):
    from transformers import AutoTokenizer

    from easyrl.trainer.multi_turn import MultiTurnRollout, multi_turn_metrics

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))
    config = PPOConfig()
    config.data.max_response_length = 64
    config.worker.rollout.calculate_log_probs = True
    mt = config.worker.rollout.multi_turn
    mt.enable, mt.tools, mt.max_assistant_turns = True, [f"{HERE / 'tools.py'}:echo"], 3
    workers = ScriptedWorkers(tokenizer)
    rollout = MultiTurnRollout(workers, config, tokenizer, pad_id=0)
    rollout.patience = float("inf")  # every round waits for all tools (the scheduler: tests/test_agents_scheduler.py)
    prompts = Batch(TensorDict({"prompts": torch.tensor([[0, 5, 6], [7, 8, 9], [0, 0, 4]]),
                                "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])}, batch_size=[3]),
                    {"raw_prompt_ids": [[5, 6], [7, 8, 9], [4]], "rollout_seed": [10, 11, 12], "images": [[]] * 3})
    try:
        batch, reshard = rollout.generate(prompts, None)
    finally:
        rollout.close()
    assert reshard == 0.5 and workers.slept == 1
    first = workers.rounds[0]
    assert len(first) == 4 and first["max_tokens"] == [64, 64, 64, 1]  # 3 padded to 4 with a 1-token copy
    assert first["raw_prompt_ids"][:3] == [[5, 6], [7, 8, 9], [4]] and first["rollout_seed"][:3] == [10, 11, 12]
    second = workers.rounds[1]
    assert second["rollout_seed"][0] != 10  # each round draws from its own stream
    assert second["raw_prompt_ids"][0][:2 + len(workers.ids)] == [5, 6] + workers.ids  # prompt + turn 1 as generated
    assert second["max_tokens"][0] == 64 - (len(second["raw_prompt_ids"][0]) - 2)  # the remaining budget
    # the batch: every response token after the prompt, the mask only on the assistant's
    R = 64
    assert batch["responses"].shape == batch["response_mask"].shape == batch["rollout_log_probs"].shape == (3, R)
    valid = batch["attention_mask"][:, -R:]
    assert torch.equal(batch["input_ids"], torch.cat([prompts["prompts"], batch["responses"]], 1))
    assert torch.all(batch["response_mask"] <= valid) and (valid - batch["response_mask"]).sum() > 0
    assert torch.all((batch["rollout_log_probs"] != 0) == batch["response_mask"].bool())
    turns = [s["assistant_turns"] for s in batch["multi_turn_stats"]]
    assert [len(calls) for calls in batch["tool_calls"]] == [t - 1 for t in turns]
    assert multi_turn_metrics(batch)["multi_turn/tool_errors"] == 0.0
