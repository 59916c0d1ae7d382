"""Multi-turn vs single-turn rollout throughput on the same token budget (issue #22; docs/agents.md).

One trainer (real Ray + vLLM + FSDP2 on the CPU) with the multi-turn rollout: every assistant turn of at most
``--turn-tokens`` tokens calls the ``echo`` test tool (the plug-in parser ``tests/agent_tools/parser.py:echo_only``,
since a random tiny model writes no tool calls), ``--turns`` assistant turns per trajectory. The single-turn rollout
(``SingleTurnRollout`` on the same engines) generates ``turns x turn-tokens`` tokens per prompt in one go
(``max_tokens``). The multi-turn rollout runs twice: with the scheduler (``easyrl.agents.scheduler``: a round does
not wait for late tools) and with the round barrier (``patience=inf``: every round waits for its slowest tool).
All sample the same prompt batch, alternately, ``--repeats`` times after one warm-up each; the throughput is
generated (assistant) tokens per second of ``Rollout.generate`` (tool calls, tool-turn tokenization and the extra
prefills included for the multi-turn one). Two cases, one trainer: the tool (``lagging``: ``echo`` whose first
call in a rollout sleeps) answers at once, then one call per rollout (one trajectory's) sleeps ``--slow-tool-s``.

    python bench/multi_turn_speed.py [--turns 3] [--turn-tokens 32] [--repeats 3] [--slow-tool-s 2] [key=value ...]

``--workload varied`` (issue #46): trajectories that differ in turn count and tool latency, each turn's text deciding
(``tests/agent_tools/parser.py:varied``: a third of the turns answer and end the trajectory, up to ``--turns``
turns, default 6 here) and each tool call sleeping 0-2 s by its text (``tools.py:nap``), one tool process per sample.
The multi-turn rollout three ways on the same prompts and seeds: by request (``patience: null``, the default: each
trajectory's next turn goes to the engine as soon as its tool answers), in rounds with the scheduler (``patience:
0.25``, the default before) and with the round barrier (``inf``); trajectories per second of ``Rollout.generate``,
and the ratios against the rounds.

    python bench/multi_turn_speed.py --workload varied [--repeats 3] [key=value ...]

``--workload agent`` (issue #47): ``--sessions`` (32) agent sessions at once on one CPU engine through easyrl's
OpenAI-compatible endpoint (``worker.rollout.agent``; the official ``openai`` client,
``tests/agent_tools/openai_agent.py:echo_turns``: ``--turns`` turns of at most ``--turn-tokens`` tokens, each answered
as the ``echo`` tool answers) beside the built-in multi-turn rollout on the same task, prompts and engine (by request,
``echo`` every turn); requests/s (assistant turns), sampled tokens/s and the engine's decode-slot occupancy of
``Rollout.generate``, and the ratios agent / built-in.

    python bench/multi_turn_speed.py --workload agent [--sessions 32] [--repeats 3] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("lagging", "varied", "agent"), default="lagging")
    parser.add_argument("--sessions", type=int, default=32, help="agent: sessions at once (a multiple of 4)")
    parser.add_argument("--turns", type=int, default=None, help="assistant turns (default 3; varied: at most, 6)")
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-tool-s", type=float, default=2.0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    varied, agent = args.workload == "varied", args.workload == "agent"
    args.turns = args.turns or (6 if varied else 3)

    import os

    import ray

    from easyrl.config import load_config
    from easyrl.testing.tiny import build_tiny_model
    from easyrl.trainer.__main__ import build_trainer
    from easyrl.trainer.rollout import SingleTurnRollout

    tools = REPO / "tests" / "agent_tools"
    markers = Path(tempfile.mkdtemp())  # the lagging tool's first-call marker (inherited by the tool processes)
    os.environ.update(EASYRL_TEST_TOOL_DIR=str(markers), EASYRL_TEST_TOOL_SLEEP_S=str(args.slow_tool_s),
                      EASYRL_BENCH_TURNS=str(args.turns), EASYRL_BENCH_TURN_TOKENS=str(args.turn_tokens))
    budget = args.turns * args.turn_tokens
    config = load_config([
        f"config={REPO / 'examples/configs/cpu_demo.yaml'}",
        f"worker.actor.model.model_path={build_tiny_model('qwen2_5')}",
        f"data.train_files={REPO / 'examples/data/geometry3k_sample'}", "data.val_files=null",
        f"data.format_prompt={REPO / 'examples/format_prompt/math.jinja'}",
        f"worker.reward.reward_function={tools / 'reward.py'}:compute_score", "worker.reward.reward_function_kwargs={}",
        f"trainer.runs_root={tempfile.mkdtemp()}", "worker.rollout.limit_images=0",
        f"data.max_response_length={budget + 40 * (args.turns - 1)}",  # the tool turns' tokens fit too
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.tools=[{tools / 'tools.py'}:{'nap' if varied else 'lagging'}]",
        f"worker.rollout.multi_turn.format={tools / 'parser.py'}:{'varied' if varied else 'lagging_only'}",
        *((f"data.rollout_batch_size={args.sessions // 4}", "trainer.n_gpus_per_node=1",  # one engine
           "data.max_prompt_length=512", f"worker.rollout.multi_turn.tools=[{tools / 'tools.py'}:echo]",
           f"worker.rollout.multi_turn.format={tools / 'parser.py'}:echo_only") if agent else ()),
        f"worker.rollout.multi_turn.max_assistant_turns={args.turns}",
        f"worker.rollout.multi_turn.max_turn_tokens={args.turn_tokens}",
        *((f"worker.rollout.multi_turn.num_tool_workers={4 * 4}",) if varied else ()),  # one per sample (cpu_demo)
        *args.overrides,
    ])
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = None
    try:
        trainer = build_trainer(config)
        multi = trainer.generator.rollout
        if varied:
            _varied(multi, trainer.generator.prompt_batch(next(trainer.prompt_stream()), config.worker.rollout.n, 1),
                    args.repeats)
            return
        if agent:
            _agent(trainer, config, args.repeats)
            return
        single = SingleTurnRollout(trainer.workers, config.data.max_response_length, trainer.pad_id)
        prompts = trainer.generator.prompt_batch(next(trainer.prompt_stream()), config.worker.rollout.n, step=1)
        flat = prompts.select(list(range(len(prompts))))
        flat["max_tokens"] = [budget] * len(flat)
        modes = (("single-turn", single, flat, "-"), ("multi-turn", multi, prompts, multi.patience),
                 ("multi-turn, round barrier", multi, prompts, float("inf")))
        for slow in (False, True):
            rates: dict[str, list[float]] = {name: [] for name, *_ in modes}
            seconds: dict[str, list[float]] = {name: [] for name, *_ in modes}
            for repeat in range(args.repeats + 1):
                for name, rollout, batch, patience in modes:
                    if patience != "-":  # a multi-turn mode: its scheduling (None: by request)
                        multi.patience = patience
                    if slow:  # one slow call per rollout
                        (markers / "lagging").unlink(missing_ok=True)
                    else:
                        (markers / "lagging").touch()
                    start = time.perf_counter()
                    out, _ = rollout.generate(batch, None)
                    took = time.perf_counter() - start
                    if repeat:  # the first of each is warm-up
                        rates[name].append(float(out["response_mask"].sum()) / took)
                        seconds[name].append(took)
            medians = {name: statistics.median(values) for name, values in rates.items()}
            print(f"\n{'one tool call sleeps %g s' % args.slow_tool_s if slow else 'tools answer at once'}: "
                  f"{len(prompts)} samples, {args.turns} turns x {args.turn_tokens} tokens vs {budget} tokens")
            print(f"| rollout | generated tokens/s | seconds per rollout (median of {args.repeats}) |\n"
                  "| --- | --- | --- |")
            for name, value in medians.items():
                print(f"| {name} | {value:.0f} | {statistics.median(seconds[name]):.2f} |")
            print(f"multi / single = {medians['multi-turn'] / medians['single-turn']:.2f}, round barrier / single = "
                  f"{medians['multi-turn, round barrier'] / medians['single-turn']:.2f}", flush=True)
    finally:
        if trainer is not None:
            trainer.close()
        ray.shutdown()


VARIED_MODES = (("by request", None), ("rounds (patience 0.25)", 0.25), ("round barrier", float("inf")))


def _varied(multi, prompts, repeats: int) -> None:
    """The varied workload (module docstring): each of ``VARIED_MODES`` in turn, ``repeats`` times after a warm-up;
    prints trajectories/s, generated tokens/s, the turns and the ratios against the rounds."""
    rates: dict[str, list[float]] = {name: [] for name, _ in VARIED_MODES}
    tokens: dict[str, list[float]] = {name: [] for name, _ in VARIED_MODES}
    turns = {}
    for repeat in range(repeats + 1):
        for name, patience in VARIED_MODES:
            multi.patience = patience
            start = time.perf_counter()
            out, _ = multi.generate(prompts, None)
            took = time.perf_counter() - start
            turns[name] = sorted(s["assistant_turns"] for s in out["multi_turn_stats"])
            if repeat:  # the first of each is warm-up
                rates[name].append(len(prompts) / took)
                tokens[name].append(float(out["response_mask"].sum()) / took)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nvaried workload: {len(prompts)} trajectories, assistant turns {turns['by request']}, tools sleeping "
          "0-2 s")
    print(f"| rollout | trajectories/s | generated tokens/s | ratio to rounds (median of {repeats}) |\n"
          "| --- | --- | --- | --- |")
    base = medians["rounds (patience 0.25)"]
    for name, value in medians.items():
        print(f"| {name} | {value:.3f} | {statistics.median(tokens[name]):.0f} | {value / base:.2f} |")
    assert len({tuple(t) for t in turns.values()}) == 1, f"the modes ran different trajectories: {turns}"


def _agent(trainer, config, repeats: int) -> None:
    """The agent workload (module docstring): the built-in multi-turn rollout and the agent rollout (its own
    ``AgentRollout`` over the trainer's engine) alternately on the same prompts, ``repeats`` times after a warm-up;
    prints requests/s, sampled tokens/s, decode-slot occupancy (medians) and the ratios agent / built-in."""
    import copy

    from easyrl.trainer.agent_rollout import AgentRollout

    agent_config = copy.deepcopy(config)
    agent_config.worker.rollout.multi_turn.enable = False
    agent_config.worker.rollout.agent.entry_point = f"{REPO / 'tests/agent_tools/openai_agent.py'}:echo_turns"
    rollouts = {"built-in multi-turn": trainer.generator.rollout,
                "agent endpoint (openai client)": AgentRollout(trainer.workers, agent_config, trainer.tokenizer,
                                                               trainer.pad_id)}
    prompts = trainer.generator.prompt_batch(next(trainer.prompt_stream()), config.worker.rollout.n, step=1)
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in rollouts}
    try:
        for repeat in range(repeats + 1):
            for name, rollout in rollouts.items():
                rollout.slot_occupancy()  # counted from here
                start = time.perf_counter()
                out, _ = rollout.generate(prompts, None)
                took = time.perf_counter() - start
                occupancy = rollout.slot_occupancy() or 0.0
                if "agent_stats" in out:  # every request's sampled tokens (a broken session trains several rows)
                    records = [r for session in rollout.last_sessions for r in session.records]
                    requests, tokens = len(records), sum(len(r.response_ids) for r in records)
                    assert all(s["outcome"] == "trained" for s in out["agent_stats"]), out["agent_stats"]
                else:
                    requests = sum(s["assistant_turns"] for s in out["multi_turn_stats"])
                    tokens = float(out["response_mask"].sum())
                if repeat:  # the first of each is warm-up
                    runs[name].append((requests / took, tokens / took, occupancy))
                print(f"  {name}: {requests} requests, {tokens:.0f} tokens in {took:.2f} s, slots {occupancy:.2f}",
                      flush=True)
    finally:
        rollouts["agent endpoint (openai client)"].close()
    medians = {name: [statistics.median(v[k] for v in values) for k in range(3)] for name, values in runs.items()}
    turns = config.worker.rollout.multi_turn
    print(f"\nagent workload: {len(prompts)} sessions at once on one engine, {turns.max_assistant_turns} turns of at "
          f"most {turns.max_turn_tokens} tokens")
    print(f"| rollout | requests/s | sampled tokens/s | decode-slot occupancy (median of {repeats}) |\n"
          "| --- | --- | --- | --- |")
    for name, (rate, tokens, occupancy) in medians.items():
        print(f"| {name} | {rate:.2f} | {tokens:.0f} | {occupancy:.2f} |")
    (a, b) = medians["agent endpoint (openai client)"], medians["built-in multi-turn"]
    print(f"agent / built-in: requests/s {a[0] / b[0]:.2f}, tokens/s {a[1] / b[1]:.2f}, occupancy {a[2] / b[2]:.2f}")


if __name__ == "__main__":
    main()
