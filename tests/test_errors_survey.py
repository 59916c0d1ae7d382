"""docs/errors.md's survey of the keys, files and variables added since 2026-11-26 (issue #52) names only entries
that exist, and covers every config key added since then."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ADDED = {"algorithm.bypass_mode", "trainer.check_collectives", "trainer.load_rollout_data_dir", "trainer.max_staleness",
         "trainer.rollout_data_dir", "trainer.rollout_data_limit", "trainer.rollout_mode",
         "worker.actor.rollout_sync_threshold", "worker.actor.router_replay.mode", "worker.actor.ulysses_size",
         "worker.reward.judge.dtype", "worker.rollout.agent.entry_point", "worker.rollout.agent.max_sessions",
         "worker.rollout.agent.timeout_s", "worker.rollout.agent.tool_call_parser", "worker.rollout.n_gpus_per_node",
         "worker.teachers"}  # valid_keys(PPOConfig) now less at commit d629cfa (2026-11-24), less the sections


def _survey() -> str:
    text = DOC.read_text()
    start = text.index("## Survey: the user-facing keys")
    return text[start:text.index("\n## ", start + 1)]


def test_the_survey_cites_only_entries_that_exist():
    ids = set(re.findall(r"^\| ([A-Z]+\d+) \|", DOC.read_text(), flags=re.M))
    cited = set()
    for a, b in re.findall(r"\b([A-Z]\d{2,3})(?:-[A-Z]?(\d{2,3}))?\b", _survey()):
        cited.add(a)
        if b:  # a range: P01-P07
            cited.update(f"{a[0]}{n:0{len(b)}d}" for n in range(int(a[1:]) + 1, int(b) + 1))
    assert cited and not cited - ids, sorted(cited - ids)


def test_the_survey_covers_every_key_added():
    from easyrl.config import PPOConfig, valid_keys

    survey = _survey()
    assert ADDED <= set(valid_keys(PPOConfig))
    assert [key for key in sorted(ADDED) if f"`{key}`" not in survey] == []
