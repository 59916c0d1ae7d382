"""A broken agent session's earlier segments as samples of their own (``easyrl.trainer.session_rows``; the engines'
side is tests/test_e2e_agent.py): which segments train, the rows they become (masks, fillers up to the data-parallel
groups), the session's scores on each, the advantage computed over sessions and copied to their segments, the
mini-batches cut from a longer batch, and the ``agent/*`` counts over sessions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from easyrl.agents.segments import RequestRecord, assemble_segments
from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage
from easyrl.batch import Batch
from easyrl.config import PPOConfig
from easyrl.trainer.agent_rollout import agent_metrics, segments_batch, session_trajectory
from easyrl.trainer.session_rows import add_segment_rows, scoring_view, session_positions, share_scores

P, R = 6, 8


def _record(index, prompt, response):
    return RequestRecord(prompt_ids=prompt, response_ids=response, log_probs=[-0.5] * len(response),
                         finish_reason="stop", index=index, versions=[3] * len(response))


def _broken_session():
    """Three requests, each re-rendering the earlier turns (a break every time): three segments."""
    return assemble_segments([_record(0, [1, 2], [10, 11]), _record(1, [1, 3, 10], [12]),
                              _record(2, [1, 4, 12, 5], [13, 14, 15])])


def test_the_last_segment_scores_and_the_earlier_ones_train_unless_too_long_or_empty():
    segments = _broken_session()
    last, earlier, too_long, why = session_trajectory(segments, max_prompt_length=P)
    assert why == "" and last.requests == [2] and [s.requests for s in earlier] == [[0], [1]] and too_long == 0
    _, earlier, too_long, _ = session_trajectory(segments, max_prompt_length=3)  # [1, 3, 10] fits; the last does not
    assert earlier == [] and too_long == 0  # the last's prompt is too long: nothing of the session trains
    long_first = assemble_segments([_record(0, [1, 2, 3, 4], [10]), _record(1, [1, 9], [12])])
    last, earlier, too_long, why = session_trajectory(long_first, max_prompt_length=3)
    assert why == "" and last.requests == [1] and earlier == [] and too_long == 1
    empty_first = assemble_segments([_record(0, [1, 2], []), _record(1, [1, 9], [12])])
    assert session_trajectory(empty_first, max_prompt_length=P)[1:3] == ([], 0)  # no sampled token: no row


def _rollout_batch(sessions):
    """The agent rollout's batch of ``sessions`` (lists of segments; [] for a failed one): one row per session (its last
    segment), its earlier segments in ``agent_segments``, two sessions per uid."""
    n = len(sessions)
    prompts = Batch(TensorDict({"prompts": torch.zeros(n, P, dtype=torch.long),
                                "prompt_mask": torch.zeros(n, P, dtype=torch.long)}, batch_size=[n]),
                    {"raw_prompt_ids": [[7]] * n, "uid": [f"g{i // 2}" for i in range(n)],
                     "ground_truth": [""] * n})
    picked = [session_trajectory(segments, P) for segments in sessions]
    batch = segments_batch(prompts, [p[0] for p in picked], P, R, pad_id=0)
    batch["agent_segments"] = [p[1] for p in picked]
    batch["agent_stats"] = [{"outcome": "trained" if p[0] else "no_requests", "requests": 3, "segments": len(s),
                             "http_errors": 0, "segment_requests": [e.requests for e in p[1]],
                             "segments_too_long": p[2]} for s, p in zip(sessions, picked)]
    return batch


def test_earlier_segments_become_rows_padded_to_the_groups():
    batch = add_segment_rows(_rollout_batch([_broken_session(), [], assemble_segments([_record(0, [5], [6])]), []]),
                             multiple=4, prompt_length=P, response_length=R, pad_id=0)
    assert "agent_segments" not in batch and len(batch) == 8  # 4 sessions, 2 earlier segments, 2 fillers
    assert batch["session"] == [0, 1, 2, 3, 0, 0, 0, 0] and batch["scoring"] == [True] * 4 + [False] * 4
    # by hand: segment [0] is prompt [1, 2] + [10, 11] sampled; segment [1] prompt [1, 3, 10] + [12]
    assert batch["prompts"][4].tolist() == [0, 0, 0, 0, 1, 2] and batch["responses"][4, :2].tolist() == [10, 11]
    assert batch["response_mask"][4].tolist() == [1, 1] + [0] * 6 and batch["response_mask"][5].tolist()[:2] == [1, 0]
    assert batch["rollout_log_probs"][4, :2].tolist() == [-0.5, -0.5] and batch["token_versions"][5, 0] == 3
    assert batch["response_mask"][6:].sum() == 0 and batch["attention_mask"][6:, P:].sum() == 0  # fillers


def test_a_batch_without_earlier_segments_keeps_its_rows():
    batch = _rollout_batch([assemble_segments([_record(0, [5], [6])])] * 2)
    out = add_segment_rows(batch, multiple=2, prompt_length=P, response_length=R, pad_id=0)
    assert out is batch and out["scoring"] == [True, True] and scoring_view(out) is out
    assert session_positions(out) is None


def test_each_row_gets_its_sessions_scores_and_the_metrics_count_sessions():
    batch = add_segment_rows(_rollout_batch([_broken_session(), [], assemble_segments([_record(0, [5], [6])]), []]),
                             multiple=4, prompt_length=P, response_length=R, pad_id=0)
    batch = batch.select([5, 0, 6, 3, 4, 1, 7, 2])  # the balanced order of the passes
    view = scoring_view(batch)
    assert view["session"] == [0, 3, 1, 2]
    view["score/overall"], view["score/accuracy"] = [1.0, 0.0, 0.25, 0.5], [1.0, 0.0, 0.0, 1.0]
    share_scores(batch, view)
    assert batch["score/overall"] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.25, 1.0, 0.5]
    totals = batch["token_level_scores"].sum(-1).tolist()
    assert totals == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.5]  # on the last trained token; none on an empty row
    assert batch["token_level_scores"][0, 0] == 1.0  # segment [1]: one sampled token, then its gap
    assert session_positions(batch).tolist() == [1, 1, 1, 3, 1, 5, 1, 7]
    metrics = agent_metrics(batch)
    assert metrics["agent/trained"] == 2 and metrics["agent/no_requests"] == 2 and metrics["agent/segment_rows"] == 2
    assert metrics["agent/segments/mean"] == 1.0 and metrics["agent/broken_sessions"] == 1


def _inputs(scores, masks, uids, **settings):
    mask = torch.tensor(masks, dtype=torch.float32)
    last = torch.tensor([max(i for i, m in enumerate(row) if m) for row in masks])
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(scores)), last] = torch.tensor(scores)
    return AdvantageInputs(rewards, mask, np.array(uids, dtype=object), **settings)


# group g0: session 0 (score 1, three segments: rows 0, 4, 5) and session 1 (score 0); group g1: sessions 2, 3
MASKS = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 0, 0]]
SCORES, UIDS, SESSIONS = [1.0, 0.0, 2.0, 0.0, 1.0, 1.0], ["g0", "g0", "g1", "g1", "g0", "g0"], [0, 1, 2, 3, 0, 0]


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg"])
def test_the_advantage_is_computed_over_sessions_and_copied_to_their_segments(name):
    advantages, returns = compute_advantage(name, _inputs(SCORES, MASKS, UIDS), sessions=np.array(SESSIONS))
    alone, alone_returns = compute_advantage(name, _inputs(SCORES[:4], MASKS[:4], UIDS[:4]))
    assert torch.allclose(advantages[:4], alone) and torch.allclose(returns[:4], alone_returns)
    for row in (4, 5):  # session 0's advantage on each of its segments' trained tokens, 0 elsewhere
        assert torch.allclose(advantages[row], alone[0, 0] * torch.tensor(MASKS[row], dtype=torch.float32))


def test_a_three_segment_session_does_not_weigh_three_times_in_its_groups_mean():
    inputs = _inputs(SCORES, MASKS, UIDS, norm_adv_by_std_in_grpo=False)
    advantages, _ = compute_advantage("grpo", inputs, sessions=np.array(SESSIONS))
    # Dr. GRPO: R - the mean over the group's sessions (1 and 0): +0.5 and -0.5, on every segment of session 0
    assert advantages[0, 0] == pytest.approx(0.5) and advantages[1, 0] == pytest.approx(-0.5)
    assert advantages[4, 1] == pytest.approx(0.5) and advantages[5, 0] == pytest.approx(0.5)
    assert compute_advantage("grpo", inputs)[0][0, 0] == pytest.approx(0.25)  # its rows as samples: 1 - 0.75


def test_a_token_level_estimator_runs_on_every_row_with_the_sessions_reward_at_its_end():
    inputs = _inputs(SCORES, MASKS, UIDS)
    advantages, returns = compute_advantage("reinforce_plus_plus", inputs, sessions=np.array(SESSIONS))
    assert torch.equal(advantages, compute_advantage("reinforce_plus_plus", inputs)[0])
    assert returns[4].tolist() == [0.0, 1.0, 1.0]  # a segment row: its own trajectory ending in the session's reward


def test_mini_batches_are_cut_from_the_rows_so_the_optimizer_steps_stay_as_configured():
    config = PPOConfig()
    config.data.rollout_batch_size, config.worker.rollout.n, config.worker.actor.global_batch_size = 4, 2, 2
    config.trainer.n_gpus_per_node = 2
    share = 4 * 2 // config.dp_size
    assert config.mini_batch_samples("actor", share) == config.mini_batch_samples("actor") == 2
    assert config.mini_batch_samples("actor", 7) == 4  # 7 rows: mini-batches of 4 and 3, still two optimizer steps
    grid = [(r, g, n, w) for r in (2, 4, 8) for g in (1, 2, 4, 8) for n in (1, 2, 4) for w in (1, 2, 4)
            if r % g == 0 and g * n % w == 0]
    for rollout_batch, global_batch, n, world in grid:
        config.data.rollout_batch_size, config.worker.actor.global_batch_size = rollout_batch, global_batch
        config.worker.rollout.n, config.trainer.n_gpus_per_node = n, world
        assert config.mini_batch_samples("actor", rollout_batch * n // world) == config.mini_batch_samples("actor")
