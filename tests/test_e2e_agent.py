"""End to end with a black-box agent (``worker.rollout.agent``, issue #47): an agent written with the official
``openai`` client (``tests/agent_tools/openai_agent.py``: a tool-calling loop of three turns) talks to vLLM's own
OpenAI serving layer on the rollout engines of the tiny text model and trains two GRPO steps. Every trained token is
one the engine sampled for the session, with the engine's log-prob; the masks count the gap tokens as the records
say; the agent was served the text of those tokens; one agent that raises is counted and the run goes on. The tiny
random model's sessions break (some of its replies re-render to other ids, and the agent rewrites its history before
its last request), so their earlier segments train as rows of their own, token-exact too, each with its session's
GRPO advantage computed over the sessions of its group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

AGENT = Path(__file__).parent / "agent_tools" / "openai_agent.py"


def test_an_openai_agent_trains_on_the_tokens_the_engine_sampled(e2e_text_config, trainer_on_ray, tmp_path):
    config = e2e_text_config(tmp_path, "trainer.max_steps=2", "data.rollout_batch_size=2", "worker.rollout.n=2",
                             f"worker.rollout.agent.entry_point={AGENT}:run", "worker.rollout.agent.timeout_s=120",
                             "data.max_prompt_length=512", "algorithm.use_kl_loss=false")
    with trainer_on_ray(config) as trainer:
        trainer.fit()
        rows = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
        assert [row["agent/failed"] for row in rows] == [1.0, 0.0]  # the planted failure, once; the run went on
        assert all(row["agent/trained"] + row["agent/failed"] == 4 for row in rows), rows
        assert all(row["agent/requests/mean"] >= 2.25 and row["rollout/log_prob_diff_max"] < 2e-3 for row in rows)
        print("AGENT broken sessions", [row["agent/broken_sessions"] for row in rows],
              "segments/mean", [row["agent/segments/mean"] for row in rows],
              "timing_s", [{k[9:]: round(v, 1) for k, v in row.items() if k.startswith("timing_s/")} for row in rows])
        batch, sessions = trainer.last_batch, trainer.generator.rollout.last_sessions
        last = rows[-1]
        print("AGENT segment rows", [row["agent/segment_rows"] for row in rows], "of", len(batch), "rows")

        def by_hand(records):  # each request's sampled tokens (mask 1), then the next prompt's new tokens (mask 0)
            expected, expected_mask = [], []
            for k, record in enumerate(records):
                expected += record.response_ids
                expected_mask += [1] * len(record.response_ids)
                if k + 1 < len(records):
                    gap = records[k + 1].prompt_ids[len(record.prompt_ids) + len(record.response_ids):]
                    expected += gap
                    expected_mask += [0] * len(gap)
            return expected, expected_mask

        def check_row(row, records):  # the row holds these requests token-exact, as the engine sampled them
            mask = batch["response_mask"][row].bool()
            length = int(batch["attention_mask"][row, -batch["responses"].shape[1]:].sum())
            trained = batch["responses"][row][:length].tolist()
            # the prompt is the first trained request's, as vLLM's renderer rendered it
            prompt = batch["prompts"][row][batch["prompt_mask"][row].bool()].tolist()
            assert prompt == records[0].prompt_ids
            expected, expected_mask = by_hand(records)
            assert trained == expected[:length] and mask[:length].tolist() == [bool(m) for m in expected_mask][:length]
            sampled = torch.tensor([lp for record in records for lp in record.log_probs])[: int(mask.sum())]
            assert torch.equal(batch["rollout_log_probs"][row][mask], sampled)

        checked, segment_row = 0, len(sessions)  # the earlier segments' rows follow the sessions' own, in order
        for i, session in enumerate(sessions):
            stats = batch["agent_stats"][i]
            assert stats["outcome"] == "trained" and len(session.records) == 3 and batch["scoring"][i]
            check_row(i, [session.records[j] for j in stats["trained_requests"]])
            # the agent was served exactly the text of the tokens the engine sampled
            result = batch["agent_result"][i]
            assert result["replies"][-1] == trainer.tokenizer.decode(session.records[-1].response_ids,
                                                                     skip_special_tokens=True)
            # a broken session's earlier segments are rows of their own: every sampled request trains in one row
            requests = {j for each in [stats["trained_requests"], *stats["segment_requests"]] for j in each}
            assert {j for j, record in enumerate(session.records) if record.response_ids} <= requests
            assert stats["trained_requests"] == [2] and stats["segment_requests"]  # the agent's rewrite broke it
            for segment in stats["segment_requests"]:
                assert batch["session"][segment_row] == i and not batch["scoring"][segment_row]
                check_row(segment_row, [session.records[j] for j in segment])
                segment_row += 1
            checked += 1
        assert checked == 4 and last["agent/segment_rows"] == segment_row - 4 > 0
        assert len(batch) - segment_row < 2 and not batch["response_mask"][segment_row:].any()  # fillers: 0 or 1
        # GRPO over the sessions by hand (a group's two sessions, one reward each), the same on each segment's tokens
        scores = {i: batch["score/overall"][i] for i in range(4)}
        for row in range(len(batch)):
            i = batch["session"][row]
            group = [scores[j] for j in range(4) if batch["uid"][j] == batch["uid"][i]]
            expected = (scores[i] - sum(group) / 2) / (torch.tensor(group).std().item() + 1e-6)
            mask = batch["response_mask"][row].bool()
            assert torch.allclose(batch["advantages"][row][mask], torch.tensor(expected), atol=1e-5), (row, expected)
