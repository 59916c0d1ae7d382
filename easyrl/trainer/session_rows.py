"""Rows that share an agent session (docs/agents.md, "Bring your agent"): a broken session's earlier segments train as
samples of their own beside its last one, all sharing the session's reward and advantage, as verl's and slime's
agent loops train theirs.

:func:`add_segment_rows` turns the agent rollout's batch (one row per session, its earlier segments in the extra
``agent_segments``) into the step's batch: the sessions' rows first, as they were, then each earlier segment as a row
of its own, then filler rows (the first row's prompt and an empty response, as a failed session's row: they train
nothing) up to a multiple of the data-parallel groups, which every pass splits the batch into. Two extras name each
row's session:

* ``session``: the session's row in the rollout's batch (its generation order; a label that moves with the row);
* ``scoring``: True on the session's own row (its last segment), the one the reward function, the judge and the
  reward model score once, and the one the advantage's group statistics count once (``compute_advantage``'s
  ``sessions``).

:func:`scoring_view` and :func:`share_scores` are the reward phase's side of it, :func:`session_positions` the
advantage's. In a batch without ``scoring`` (any other rollout) every row is its own sample.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from easyrl.batch import Batch
from easyrl.rewards.function import scores_to_token_rewards
from easyrl.trainer.agent_rollout import segments_batch

__all__ = ["SCORING", "SESSION", "add_segment_rows", "scoring_view", "session_positions", "share_scores"]

SESSION, SCORING = "session", "scoring"


def add_segment_rows(batch: Batch, multiple: int, prompt_length: int, response_length: int, pad_id: int) -> Batch:
    """The step's batch of an agent rollout's ``batch`` (module docstring): ``len(batch)`` session rows, then one row
    per earlier segment (laid out as ``segments_batch`` lays them out: ``prompt_length`` / ``response_length`` tokens,
    padded with ``pad_id``), then fillers up to a multiple of ``multiple`` rows; ``session`` and ``scoring`` on every
    row. The extra ``agent_segments`` is consumed (``KeyError`` without it)."""
    earlier = batch.extras.pop("agent_segments")
    n = len(batch)
    batch[SESSION], batch[SCORING] = list(range(n)), [True] * n
    sources = [i for i, segments in enumerate(earlier) for _ in segments]
    fill = (-(n + len(sources))) % multiple
    if not sources and not fill:
        return batch
    rows = segments_batch(batch.select(sources + [0] * fill),
                          [segment for segments in earlier for segment in segments] + [None] * fill,
                          prompt_length, response_length, pad_id)
    rows[SCORING] = [False] * len(rows)
    return Batch.cat([batch, rows])


def scoring_view(batch: Batch) -> Batch:
    """The rows of ``batch`` that score their session, in its order: ``batch`` itself when every row does (or it has no
    ``scoring``), else a copy of those rows (score it, then :func:`share_scores`)."""
    if SCORING not in batch or all(batch[SCORING]):
        return batch
    return batch.select([i for i, scores in enumerate(batch[SCORING]) if scores])


def share_scores(batch: Batch, view: Batch) -> None:
    """Give every row of ``batch`` its session's scores from ``view`` (:func:`scoring_view` of it, scored): the
    ``score/<name>`` values (and ``judge_verdict``), and ``token_level_scores`` ``(bsz, resp_len)`` with the session's
    ``score/overall`` on the row's last trained token (none on a filler). Nothing when ``view`` is ``batch``."""
    if view is batch:
        return
    where = {session: k for k, session in enumerate(view[SESSION])}
    rows = [where[session] for session in batch[SESSION]]
    for key in [key for key in view.extras if key.startswith("score/") or key == "judge_verdict"]:
        batch[key] = [view[key][k] for k in rows]
    overall = torch.tensor(batch["score/overall"], dtype=torch.float32)
    batch["token_level_scores"] = scores_to_token_rewards(overall, batch["response_mask"])


def session_positions(batch: Batch) -> Optional[np.ndarray]:
    """``(bsz,)`` int64: for each row of ``batch`` the position of its session's scoring row (its own on a scoring
    row), or None when every row is its own sample (no ``scoring``, or every row scores)."""
    if SCORING not in batch or all(batch[SCORING]):
        return None
    where = {session: i for i, (session, scores) in enumerate(zip(batch[SESSION], batch[SCORING])) if scores}
    return np.array([where[session] for session in batch[SESSION]], dtype=np.int64)
