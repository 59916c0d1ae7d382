"""Multi-turn responses have holes in ``response_mask`` (tool turns): the outcome-reward advantage estimators and
the reward placement must treat the holes as absent, giving on the trained tokens what the same trajectory without
its tool tokens gets (``easyrl.algorithms``, ``easyrl.rewards.function.scores_to_token_rewards``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
from easyrl.rewards.function import scores_to_token_rewards

# estimators whose advantage does not depend on token positions (GAE, OTB and REINFORCE++ discount by position)
OUTCOME = ["grpo", "rloo", "opo", "gpg", "remax", "reinforce_plus_plus_baseline", "grpo_passk"]


def _holed(compact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The compact rows with a 3-token tool turn after each row's 2nd token: (values, mask)."""
    bsz, length = compact.shape
    values = torch.zeros(bsz, length + 3, dtype=compact.dtype)
    values[:, :2], values[:, 5:] = compact[:, :2], compact[:, 2:]
    mask = torch.ones(bsz, length + 3, dtype=torch.long)
    mask[:, 2:5] = 0
    return values, mask


@pytest.mark.parametrize("name", OUTCOME)
def test_tool_turn_holes_are_transparent(name):
    torch.manual_seed(0)
    bsz, length = 8, 6
    compact_mask = torch.ones(bsz, length, dtype=torch.long)
    compact_mask[::2, 4:] = 0  # some responses shorter
    scores = torch.rand(bsz)
    index = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    holed_mask = _holed(compact_mask)[1] * torch.cat([compact_mask[:, :2], torch.ones(bsz, 3, dtype=torch.long),
                                                      compact_mask[:, 2:]], 1)
    extra = {"reward_baselines": torch.rand(bsz)} if name == "remax" else {}
    compact = ADV_ESTIMATORS.get(name)(AdvantageInputs(scores_to_token_rewards(scores, compact_mask), compact_mask,
                                                       index, **extra))[0]
    holed = ADV_ESTIMATORS.get(name)(AdvantageInputs(scores_to_token_rewards(scores, holed_mask), holed_mask,
                                                     index, **extra))[0]
    assert torch.all(holed[:, 2:5] == 0)  # nothing on the tool tokens
    torch.testing.assert_close(holed[holed_mask.bool()], compact[compact_mask.bool()])


def test_the_reward_goes_on_the_last_assistant_token():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0], [1, 0, 0, 1, 0, 0, 0, 0]])
    rewards = scores_to_token_rewards(torch.tensor([2.0, 3.0]), mask)
    assert rewards.nonzero().tolist() == [[0, 5], [1, 3]]


def test_optimal_token_baseline_tail_uses_where_a_holed_response_ends():
    # one group of two: the unique longest response has a tool turn (holes); its baseline is zeroed only past the
    # second response's end (position 4), not past its trained-token count
    mask = torch.tensor([[1, 0, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]])  # 3 trained tokens, but ends last
    rewards = scores_to_token_rewards(torch.tensor([1.0, 0.5]), mask)
    inputs = AdvantageInputs(rewards, mask, np.array(["g", "g"], dtype=object),
                             old_log_probs=torch.full(mask.shape, -1.0), sum_pi_squared=torch.full(mask.shape, 0.5))
    adv, returns = ADV_ESTIMATORS.get("optimal_token_baseline")(inputs)
    # past position 4 the longest response's advantage is its return (baseline 0); before, a baseline is subtracted
    assert torch.equal(adv[0, 6:], returns[0, 6:]) and adv[0, 0] != returns[0, 0]
    assert adv[1, 3] != returns[1, 3]  # the shorter response keeps its baseline up to its end


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus"])
def test_position_based_estimators_do_not_count_tool_tokens_as_steps(name):
    # a hole (tool turn) passes the next assistant token's return, value and GAE accumulator through undiscounted
    # (verl's compute_gae_advantage_return does the same for observation tokens): with gamma, lam < 1 the trained
    # tokens get what the same trajectory without its tool tokens gets
    import easyrl.algorithms.critic  # noqa: F401 - registers gae

    torch.manual_seed(0)
    bsz, length = 4, 6
    compact_mask = torch.ones(bsz, length, dtype=torch.long)
    compact_mask[::2, 4:] = 0
    compact_rewards = scores_to_token_rewards(torch.rand(bsz), compact_mask)
    compact_rewards[:, 1] += 0.3 * compact_mask[:, 1]  # a reward before the hole too (e.g. a KL penalty)
    compact_values = torch.randn(bsz, length) * compact_mask
    rewards, mask = _holed(compact_rewards)[0], _holed(compact_mask)[0]  # the mask is 0 on the hole
    values = _holed(compact_values)[0]
    values[:, 2:5] = torch.randn(bsz, 3)  # the critic's values on tool tokens are not used
    index = np.array(["a"] * bsz, dtype=object)
    kwargs = {"gamma": 0.9, "lam": 0.8}
    compact = ADV_ESTIMATORS.get(name)(AdvantageInputs(compact_rewards, compact_mask, index, values=compact_values,
                                                       **kwargs))
    holed = ADV_ESTIMATORS.get(name)(AdvantageInputs(rewards, mask, index, values=values, **kwargs))
    for got, want in zip(holed, compact):  # advantages, returns
        assert torch.all(got[:, 2:5] == 0)
        torch.testing.assert_close(got[mask.bool()], want[compact_mask.bool()])
