"""``worker.rollout.multi_turn.patience`` (docs/agents.md "Scheduling"): its default is null (each trajectory by
request, no rounds), a number the rounds' patience (the scheduler's ``PATIENCE`` is 0.25), ``inf`` is accepted (the round barrier), and the configured value is what ``run_turns`` gets (its check: errors.md
A11, tests/test_errors_agents.py)."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from easyrl.agents import scheduler
from easyrl.batch import Batch
from easyrl.config import load_config
from easyrl.config.worker import MultiTurnConfig
from tests.test_agents_rollout import HERE, ScriptedWorkers


def test_the_config_default_is_by_request_and_a_number_is_the_rounds_patience():
    assert MultiTurnConfig().patience is None and scheduler.PATIENCE == 0.25  # null: run_requests (no rounds)


@pytest.mark.parametrize("word, expected", [("0.25", 0.25), ("0", 0.0), ("1.5", 1.5), ("inf", math.inf)])
def test_the_configured_patience_reaches_run_turns(e2e_args, tiny_model_path, tmp_path, monkeypatch, word, expected):
    from transformers import AutoTokenizer

    from easyrl.trainer.multi_turn import MultiTurnRollout

    words = ["worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools=[{HERE / 'tools.py'}:echo]",
             "worker.rollout.multi_turn.max_assistant_turns=1", "data.max_response_length=32",
             f"worker.rollout.multi_turn.patience={word}"]
    config = load_config(e2e_args("qwen2_5", tmp_path, *words))
    assert config.worker.rollout.multi_turn.patience == expected
    seen = []
    real_run_turns = scheduler.run_turns

    def spy(loop, trajectories, generate, patience=scheduler.PATIENCE, *args):
        seen.append(patience)
        return real_run_turns(loop, trajectories, generate, patience, *args)

    monkeypatch.setattr(scheduler, "run_turns", spy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))
    rollout = MultiTurnRollout(ScriptedWorkers(tokenizer), config, tokenizer, pad_id=0)
    prompts = Batch(TensorDict({"prompts": torch.tensor([[5, 6]]), "prompt_mask": torch.ones(1, 2, dtype=torch.long)},
                               batch_size=[1]), {"raw_prompt_ids": [[5, 6]], "images": [[]]})
    try:
        rollout.generate(prompts, None)
    finally:
        rollout.close()
    assert seen == [expected]


def test_patience_is_neutral_for_a_rerun_and_inf_survives_the_saved_config(tmp_path):
    from omegaconf import OmegaConf

    from easyrl.config.rerun import alters_training

    assert not alters_training("worker.rollout.multi_turn.patience")  # which round a turn rides in, not its tokens
    config = MultiTurnConfig(patience=math.inf)
    OmegaConf.save(OmegaConf.structured(config), tmp_path / "config.yaml")  # as the run folder's config.yaml
    assert OmegaConf.load(tmp_path / "config.yaml").patience == math.inf
