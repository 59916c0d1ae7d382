"""End to end with an LLM judge (``worker.reward.judge``, issue #23): one GRPO step of the tiny text policy in which
SmolLM2-135M-Instruct, served by a second vLLM engine on each worker, judges every response; its parsed scores must
equal a direct vLLM call (same engine settings, greedy) on the same prompts, and verdicts the parser cannot read are
counted and scored ``unparseable_score`` without stopping the run. The judge prompt is ``easyrl/rewards/judge.jinja``
plus, for problems longer than 40 characters, a filler that overflows the judge's context
(``tests/reward_functions/judge_overflow.jinja``): those verdicts are unparseable whatever the model says, beside
SmolLM2's own verdicts without a number."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from easyrl.rewards.judge import parse_number

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
WEIGHT = 0.5
UNPARSEABLE = -3.0
TEMPLATE = REPO / "tests/reward_functions/judge_overflow.jinja"


@pytest.fixture(scope="module")
def judged(e2e_text_config, trainer_on_ray, tmp_path_factory):
    """One step with the judge, then (Ray stopped) the same judge prompts through a direct vLLM engine."""
    import jinja2
    from transformers import AutoTokenizer

    from easyrl.testing.smollm2 import smollm2_path

    judge_path = str(smollm2_path())
    config = e2e_text_config(
        tmp_path_factory.mktemp("judge"), "trainer.max_steps=1",
        f"worker.reward.judge.model_path={judge_path}", f"worker.reward.judge.prompt_template={TEMPLATE}",
        f"worker.reward.judge.weight={WEIGHT}", f"worker.reward.judge.unparseable_score={UNPARSEABLE}",
        "worker.reward.judge.max_tokens=12", "worker.reward.judge.max_model_len=1024",
    )
    with trainer_on_ray(config) as trainer:
        trainer.fit()
        batch = trainer.last_batch
        inputs = trainer.scorer.reward_inputs(batch)
        rule, _ = trainer.scorer.guard(inputs, 1)  # the reward function's own scores (letters.py: deterministic)
        worker_verdicts = list(trainer.model_rewards.judging.verdicts)
    (row,) = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
    # the direct call: the template rendered by jinja2, the chat template by transformers, generation by vLLM
    template = jinja2.Template(TEMPLATE.read_text())
    tokenizer = AutoTokenizer.from_pretrained(judge_path)
    prompt_ids = []
    for item in inputs:
        message = template.render(problem=item["columns"]["prompt"], response=item["response"],
                                  ground_truth=item["ground_truth"])
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                             add_generation_prompt=True)
        prompt_ids.append(tokenizer.encode(text, add_special_tokens=False))
    judge_cfg = config.worker.reward.judge
    fits = [i for i, ids in enumerate(prompt_ids) if len(ids) + judge_cfg.max_tokens <= judge_cfg.max_model_len]
    outputs = _direct_greedy_call(config, [prompt_ids[i] for i in fits])
    direct = [None] * len(prompt_ids)  # a prompt that does not fit is not sent
    for i, text in zip(fits, outputs):
        direct[i] = text
    return {"batch": batch, "row": row, "rule": rule, "worker_verdicts": worker_verdicts, "direct": direct}


def _greedy_texts(engine_kwargs: dict, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """Greedy verdict texts of ``prompts`` from a vLLM engine built with ``engine_kwargs`` (run in a child process)."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
                      VLLM_CPU_OMP_THREADS_BIND="nobind")
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_kwargs)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts],
                           SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [out.outputs[0].text for out in outputs]


def _direct_greedy_call(config, prompts: list[list[int]]) -> list[str]:
    """The judge engine's greedy outputs of ``prompts`` from a vLLM engine built with the workers' engine arguments,
    in a spawned child process: an in-process engine would initialize torch.distributed and vLLM's platform state in
    pytest's process, which later tests (``easyrl simulate``'s fake process group and fake devices) must not see."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from easyrl.workers.judge import judge_engine_arguments

    judge_cfg, rollout = config.worker.reward.judge, config.worker.rollout
    engine_kwargs = judge_engine_arguments(judge_cfg, "cpu", rollout.seed, rollout.enforce_eager)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_greedy_texts, engine_kwargs, prompts, judge_cfg.max_tokens).result()


def test_judge_scores_equal_a_direct_vllm_call_and_enter_the_reward(judged):
    batch, direct = judged["batch"], judged["direct"]
    print("judge verdicts:", direct)
    # the workers' engines answered as a direct call (the batch is back in generation order, the verdicts are not)
    assert sorted(judged["worker_verdicts"], key=str) == sorted(direct, key=str)
    parsed = [None if v is None else parse_number(v) for v in direct]
    assert any(p is not None for p in parsed), "no verdict parsed: the comparison below would be vacuous"
    expected = [UNPARSEABLE if p is None else p for p in parsed]
    assert batch["score/judge"] == pytest.approx(expected)
    overall = [r + WEIGHT * j for r, j in zip(judged["rule"]["overall"], expected)]
    assert batch["score/overall"] == pytest.approx(overall, abs=1e-6)
    assert batch["token_level_scores"].sum(-1).tolist() == pytest.approx(overall, abs=1e-6)
    row = judged["row"]
    print("judge metrics:", {k: v for k, v in row.items() if "judge" in k or k in ("timing_s/step", "timing_s/gen")})
    assert row["reward/judge"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert row["timing_s/judge"] > 0


def test_unparseable_verdicts_are_counted_and_scored_not_fatal(judged):
    unparseable = [i for i, v in enumerate(judged["direct"]) if v is None or parse_number(v) is None]
    assert unparseable, "every judge prompt fit and every verdict parsed: nothing unparseable to count"
    assert judged["row"]["judge/unparseable"] == len(unparseable)
    assert all(judged["batch"]["score/judge"][i] == UNPARSEABLE for i in unparseable)
    # the raw verdicts travel with their samples (the generations table's judge_verdict column)
    batch = judged["batch"]
    read = [None if v is None else parse_number(v) for v in batch["judge_verdict"]]
    assert [UNPARSEABLE if r is None else r for r in read] == pytest.approx(batch["score/judge"])
