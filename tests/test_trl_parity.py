"""One GRPO step's advantages, loss and gradient through easyrl's update path and through TRL's ``GRPOTrainer`` (#53).

One fixed batch (2 prompts x 4 responses of unequal lengths, 0/1 rewards, old and reference log-probs near the
current ones, so that some ratios clip) on one tiny random-weight Qwen2 folder (fp32), at the settings
``bench/trl_grpo.py`` maps from ``examples/configs/smollm2_learn.yaml`` (temperature 0.7 instead of 1: a side that did
not divide the logits by it would show):

- easyrl: ``compute_advantage("grpo")`` as the trainer calls it, then ``FSDPPolicy.update_policy`` on one gloo rank in
  micro-batches of 4 (the token-mean's denominator spans micro-batches); the gradient is read before the optimizer step;
- TRL: ``_generate_and_score_completions`` with its generation replaced by the fixed completions (so TRL normalises
  the rewards itself), then ``compute_loss`` and ``backward``.

docs/algorithms.md ("easyrl and TRL's GRPO loss, term by term") has the measured differences and the terms that differ.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Optional
from unittest import mock

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

ATOL = 1e-5  # fp32: the loss and every gradient entry (measured: 4e-9 and 4.8e-7)
TEMPERATURE = 0.7
N, PROMPT_LEN, RESP_LEN = 4, 6, 7
PROMPT_LENGTHS, RESPONSE_LENGTHS = (4, 6), (7, 3, 5, 1, 6, 7, 2, 4)
SCORES = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # per sample; both groups have a non-zero std
TRL_STD_EPS = 1e-4  # TRL's fixed `advantages / (std + 1e-4)`; easyrl's AdvantageInputs.epsilon is 1e-6


def bench_config(model_path: Path, *overrides: str):
    """The learning bench's config on ``model_path`` for this batch (2 prompts x 4, micro-batches of 4), gradient
    clipping off (TRL clips outside its loss)."""
    from easyrl.config import load_config

    return load_config([f"config={REPO / 'examples/configs/smollm2_learn.yaml'}",
                        f"worker.actor.model.model_path={model_path}", f"worker.rollout.temperature={TEMPERATURE}",
                        "data.rollout_batch_size=2", "worker.actor.global_batch_size=2",
                        "worker.actor.micro_batch_size_per_device_for_update=4", "worker.actor.max_grad_norm=1e9",
                        *overrides])


def fixed_samples(pad_id: int) -> dict[str, torch.Tensor]:
    """``prompt_ids``/``prompt_mask`` ``(8, PROMPT_LEN)`` left-padded (sample ``i`` answers prompt ``i // N``),
    ``completion_ids``/``completion_mask`` ``(8, RESP_LEN)`` right-padded, ``scores`` ``(8,)``."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 5000, (n,), generator=g) for n in PROMPT_LENGTHS]
    prompt_ids = torch.full((len(SCORES), PROMPT_LEN), pad_id)
    completion_ids = torch.full((len(SCORES), RESP_LEN), pad_id)
    prompt_mask, completion_mask = torch.zeros_like(prompt_ids), torch.zeros_like(completion_ids)
    for i, length in enumerate(RESPONSE_LENGTHS):
        p = prompts[i // N]
        prompt_ids[i, PROMPT_LEN - len(p):], prompt_mask[i, PROMPT_LEN - len(p):] = p, 1
        completion_ids[i, :length], completion_mask[i, :length] = torch.randint(10, 5000, (length,), generator=g), 1
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "scores": torch.tensor(SCORES)}


def easyrl_advantages(samples: dict, epsilon: float = 1e-6) -> torch.Tensor:
    """easyrl's GRPO advantages ``(8,)``, called as the trainer calls it (the score on the last response token, the
    prompt's uid as the group)."""
    from easyrl.algorithms.advantages import AdvantageInputs, compute_advantage

    mask = samples["completion_mask"]
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(mask)), mask.sum(-1) - 1] = samples["scores"]
    uid = np.array([f"p{i // N}" for i in range(len(mask))], dtype=object)
    return compute_advantage("grpo", AdvantageInputs(rewards, mask, uid, epsilon=epsilon))[0][:, 0]


def trl_trainer(config, samples: dict, out: Path):
    """TRL's trainer at ``grpo_config(config)`` and the inputs dict its ``_generate_and_score_completions`` builds
    from ``samples`` (its ``_generate`` returns the fixed token ids; the reward function returns ``scores``)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl_grpo import grpo_config

    path = config.worker.actor.model.model_path
    tokenizer = AutoTokenizer.from_pretrained(path)
    scores = samples["scores"].tolist()
    unpadded = {key: [ids[m.bool()].tolist() for ids, m in zip(samples[f"{key}_ids"], samples[f"{key}_mask"])]
                for key in ("prompt", "completion")}
    completions = [tokenizer.decode(ids) for ids in unpadded["completion"]]
    args = grpo_config(config, str(out))
    rows = [{"prompt": "unused"}] * len(scores)
    trainer = GRPOTrainer(model=path, reward_funcs=lambda completions, **kwargs: scores, args=args,
                          processing_class=tokenizer, train_dataset=Dataset.from_list(rows))
    generated = (unpadded["prompt"], unpadded["completion"], None, completions, None, {}, None, None)
    with mock.patch.object(trainer, "_generate", return_value=generated):
        inputs = trainer._generate_and_score_completions(rows)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert torch.equal(inputs[key], samples[key]), key  # TRL padded the batch as easyrl's trainer does
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer's train loop
    return trainer, inputs


def trl_step(trainer, inputs: dict, bias_corrected_kl: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """TRL's loss of ``inputs`` and its gradient ``{name: tensor}``, with TRL's KL term multiplied by the ratio
    (``use_bias_correction_kl``) or not."""
    trainer.args.use_bias_correction_kl = bias_corrected_kl
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def easyrl_step(config, data: Batch) -> tuple[float, dict[str, torch.Tensor], dict]:
    """easyrl's update of ``data``: ``pg_loss + kl_coef * kl_loss``, the gradient ``{name: tensor}`` the optimizer
    steps with, and the update's metrics."""
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.workers.policy import FSDPPolicy

    actor = config.worker.actor
    policy = FSDPPolicy(actor.model.model_path, actor, init_device_mesh("cpu", (1,), mesh_dim_names=("dp",)), "cpu",
                        torch.device("cpu"), trainable=True, offload=actor.offload)
    grads = {}
    policy.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.full_tensor().clone() for n, p in policy.model.named_parameters()}))
    metrics = policy.update_policy(data, mini_batch_size=len(data),
                                   micro_batch_size=actor.micro_batch_size_per_device_for_update)
    return metrics["actor/pg_loss"][0] + actor.kl_coef * metrics["actor/kl_loss"][0], grads, metrics


def easyrl_batch(samples: dict, advantages: torch.Tensor, old: Optional[torch.Tensor], ref: torch.Tensor) -> Batch:
    """easyrl's batch of ``samples``: advantages ``(8,)`` broadcast to the response, ``old``/``ref`` log-probs
    ``(8, RESP_LEN)`` (``old`` None: an on-policy step, the update's own detached log-probs are the old ones)."""
    mask = samples["completion_mask"]
    tensors = {"input_ids": torch.cat([samples["prompt_ids"], samples["completion_ids"]], 1),
               "attention_mask": torch.cat([samples["prompt_mask"], mask], 1), "responses": samples["completion_ids"],
               "response_mask": mask, "advantages": advantages[:, None] * mask, "ref_log_probs": ref * mask}
    if old is not None:
        tensors["old_log_probs"] = old * mask
    return Batch(TensorDict(tensors, batch_size=[len(mask)]), {"multi_modal_inputs": [{} for _ in range(len(mask))]})


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Max |a - b| over every entry of every named tensor (the names must agree)."""
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.fixture(scope="module")
def parity(process_group, tiny_model_path, tmp_path_factory) -> dict:
    """Both steps on the fixed batch: ``samples``, ``config``, TRL's ``trainer`` and ``trl_inputs``, ``old``/``ref``
    log-probs ``(8, RESP_LEN)``, ``easyrl`` and ``trl`` = ``(loss, grads)`` (TRL without the KL bias correction, as the
    bench), ``trl_bias_corrected`` (TRL's default), ``metrics`` of easyrl's update. Both get TRL's advantages."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("parity_model")
    shutil.copytree(tiny_model_path("qwen2_5"), folder, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():  # the random init is near uniform: log-probs and gradients then differ by token
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)  # fp32: the folder both libraries load
    config = bench_config(folder)
    samples = fixed_samples(AutoTokenizer.from_pretrained(folder).pad_token_id)
    trainer, inputs = trl_trainer(config, samples, tmp_path_factory.mktemp("trl"))
    mask = samples["completion_mask"]
    with torch.no_grad():  # the current policy's log-probs (TRL's forward): old and reference ones around them
        current = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], mask], 1), RESP_LEN)[0]
    g = torch.Generator().manual_seed(3)
    old, ref = (current + (torch.rand(current.shape, generator=g) - 0.5) * 0.8 for _ in range(2))
    inputs["old_per_token_logps"], inputs["ref_per_token_logps"] = old * mask, ref * mask
    out = {"samples": samples, "config": config, "trl_inputs": inputs, "old": old, "ref": ref,
           "trl": trl_step(trainer, inputs, bias_corrected_kl=False),
           "trl_bias_corrected": trl_step(trainer, inputs, bias_corrected_kl=True), "trainer": trainer}
    loss, grads, out["metrics"] = easyrl_step(config, easyrl_batch(samples, inputs["advantages"], old, ref))
    out["easyrl"] = (loss, grads)
    return out


def test_advantages_match_trl(parity):
    """Both normalise by the unbiased group std; TRL adds 1e-4 to it, easyrl 1e-6 (3e-4 apart here)."""
    samples, trl = parity["samples"], parity["trl_inputs"]["advantages"]
    default = (easyrl_advantages(samples) - trl).abs().max().item()
    same_eps = (easyrl_advantages(samples, epsilon=TRL_STD_EPS) - trl).abs().max().item()
    print(f"advantages max |easyrl - TRL|: {default:.3g} (easyrl's eps 1e-6), {same_eps:.3g} (eps 1e-4)")
    assert same_eps < 1e-6 < default < 1e-3
    assert (trl != 0).all()


def test_loss_and_gradient_match_trl(parity):
    """With the same advantages, ``pg_loss + kl_coef * kl_loss`` and every gradient entry agree to 1e-5 (fp32), with
    clipping engaged on both sides of the range."""
    (loss, grads), (trl_loss, trl_grads) = parity["easyrl"], parity["trl"]
    scale = max(g.abs().max().item() for g in trl_grads.values())
    print(f"loss easyrl {loss:.7f} TRL {trl_loss:.7f}: |diff| {abs(loss - trl_loss):.3g}; gradient max |diff| "
          f"{max_diff(grads, trl_grads):.3g} (max |grad| {scale:.3g}); clipped share "
          f"{parity['metrics']['actor/pg_clipfrac'][0]:.2f}")
    assert parity["metrics"]["actor/pg_clipfrac"][0] > 0.1
    assert abs(loss - trl_loss) < ATOL
    assert max_diff(grads, trl_grads) < ATOL
    assert scale > 1e-2


def test_trl_default_kl_is_bias_corrected(parity):
    """TRL's default ``use_bias_correction_kl`` multiplies the k3 term by the ratio: another value and gradient than
    easyrl's ``low_var_kl`` (so bench/trl_grpo.py turns it off)."""
    (loss, grads), (trl_loss, trl_grads) = parity["easyrl"], parity["trl_bias_corrected"]
    print(f"TRL with use_bias_correction_kl: loss |diff| {abs(loss - trl_loss):.3g}, gradient max |diff| "
          f"{max_diff(grads, trl_grads):.3g}")
    assert max_diff(grads, trl_grads) > 10 * ATOL


def test_on_policy_kl_gradients(parity):
    """The bench's step is on-policy (``num_iterations`` 1: no old log-probs on either side). There TRL's default
    bias-corrected KL is easyrl's ``low_var_kl+`` (k3's value, k2's gradient), and without the correction (as
    bench/trl_grpo.py sets it) easyrl's ``low_var_kl``."""
    samples, ref, inputs = parity["samples"], parity["ref"], dict(parity["trl_inputs"])
    del inputs["old_per_token_logps"]  # TRL then takes its own detached log-probs, as in the bench
    data = easyrl_batch(samples, inputs["advantages"], None, ref)
    easyrl = {estimator: easyrl_step(bench_config(parity["config"].worker.actor.model.model_path,
                                                  f"algorithm.kl_penalty={estimator}"), data)[:2]
              for estimator in ("low_var_kl", "low_var_kl+")}
    trl = {corrected: trl_step(parity["trainer"], inputs, bias_corrected_kl=corrected) for corrected in (False, True)}
    diffs = {(e, c): (abs(easyrl[e][0] - trl[c][0]), max_diff(easyrl[e][1], trl[c][1])) for e in easyrl for c in trl}
    for (estimator, corrected), (loss, grad) in diffs.items():
        print(f"on-policy, easyrl {estimator} vs TRL use_bias_correction_kl={corrected}: loss |diff| {loss:.3g}, "
              f"gradient max |diff| {grad:.3g}")
    assert max(diffs[("low_var_kl", False)]) < ATOL and max(diffs[("low_var_kl+", True)]) < ATOL
    assert diffs[("low_var_kl", True)][1] > 10 * ATOL  # the bench before #53: TRL's KL gradient, not easyrl's
