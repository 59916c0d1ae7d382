"""The EasyR1 keys easyrl implements (docs/migrating.md): LR schedules and warm-up in steps, adamw_bf16, bf16 stored
weights, optimizer offload apart from parameter offload, model-only checkpoints, the chat template override, the
generation batch (mini_rollout_batch_size) and gspo_token."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from easyrl.algorithms.policy_losses import POLICY_LOSSES
from easyrl.config import FSDPConfig, OptimConfig
from easyrl.errors import ConfigError
from easyrl.workers.optim import (
    BF16AdamW,
    build_lr_scheduler,
    build_optimizer,
    lr_factor,
    move_optimizer_state,
    offloads_optimizer,
    warmup_steps,
)


def test_constant_schedule_with_warmup_steps_by_hand():
    # warm-up 3 steps: (step + 1) / 3, then 1
    assert [lr_factor(s, 3, 100, "constant") for s in range(5)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 1.0])
    assert [lr_factor(s, 0, 100, "constant") for s in range(3)] == [1.0, 1.0, 1.0]


def test_cosine_schedule_by_hand():
    # warm-up 2, 10 steps, floor 0.1: after warm-up p = (s - 2) / 8 and factor = 0.1 + 0.9 * (1 + cos(pi p)) / 2
    values = [lr_factor(s, 2, 10, "cosine", 0.1) for s in (0, 1, 2, 4, 6, 10, 12)]
    assert values == pytest.approx([0.5, 1.0, 1.0, 0.1 + 0.45 * (1 + math.sqrt(0.5)), 0.55, 0.1, 0.1])
    assert lr_factor(6, 2, 10, "cosine") == pytest.approx(0.5)  # min_lr_ratio None: down to 0
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        lr_factor(0, 0, 10, "linear")


def test_warmup_steps_win_over_ratio_and_drive_the_scheduler():
    optim = OptimConfig(lr=0.1, lr_warmup_ratio=0.5, lr_warmup_steps=4, lr_scheduler_type="cosine", min_lr_ratio=0.0)
    assert warmup_steps(optim, training_steps=8) == 4
    optim.lr_warmup_steps = None
    assert warmup_steps(optim, training_steps=8) == 4  # int(0.5 * 8)
    optim.lr_warmup_steps, optim.lr_warmup_ratio = 2, 0.0
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=optim.lr)
    scheduler = build_lr_scheduler(optimizer, optim, training_steps=8)
    seen = []
    for _ in range(9):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    # 0.05, 0.1, then 0.1 * (1 + cos(pi (s - 2) / 6)) / 2 for s = 2..8
    expected = [0.05, 0.1] + [0.1 * (1 + math.cos(math.pi * (s - 2) / 6)) / 2 for s in range(2, 9)]
    assert seen == pytest.approx(expected)


def test_adamw_bf16_keeps_bf16_moments_and_follows_adamw():
    torch.manual_seed(0)
    start = torch.randn(64)
    grads = [torch.randn(64) for _ in range(5)]
    results = {}
    for strategy in ("adamw", "adamw_bf16"):
        param = torch.nn.Parameter(start.clone())
        optimizer = build_optimizer([param], OptimConfig(lr=1e-2, weight_decay=0.1, strategy=strategy))
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        results[strategy] = (param.detach().clone(), optimizer)
    bf16_optimizer = results["adamw_bf16"][1]
    assert isinstance(bf16_optimizer, BF16AdamW) and isinstance(results["adamw"][1], torch.optim.AdamW)
    state = next(iter(bf16_optimizer.state.values()))
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    moved = results["adamw"][0] - start
    assert moved.abs().mean() > 1e-2  # five steps of ~lr each
    # same trajectory up to bf16 rounding of the moments (relative 2^-8 per step)
    torch.testing.assert_close(results["adamw_bf16"][0] - start, moved, rtol=0.05, atol=5e-4)


def test_optimizer_offload_placement_decision():
    assert offloads_optimizer("cuda", offload_params=False, offload_optimizer=True)
    assert offloads_optimizer("npu", offload_params=False, offload_optimizer=True)
    assert not offloads_optimizer("cuda", offload_params=True, offload_optimizer=True)  # CPUOffloadPolicy has them
    assert not offloads_optimizer("cpu", offload_params=False, offload_optimizer=True)  # host = device
    assert not offloads_optimizer("cuda", offload_params=False, offload_optimizer=False)


def test_move_optimizer_state_moves_moments_not_step():
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([param])
    param.grad = torch.ones(3)
    optimizer.step()
    move_optimizer_state(optimizer, "meta")
    state = optimizer.state[param]
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu"


def test_bf16_stored_weights():
    from easyrl.workers.fsdp_model import stored_dtype

    assert stored_dtype(FSDPConfig(), trainable=True) == torch.float32
    assert stored_dtype(FSDPConfig(torch_dtype="bf16"), trainable=True) == torch.bfloat16
    assert stored_dtype(FSDPConfig(torch_dtype="bf16", param_dtype="fp16"), trainable=False) == torch.float16


def _role(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return SimpleNamespace(model=model, optimizer=optimizer, torch_device=torch.device("cpu"),
                           optimizer_to=lambda device: None)


def test_model_only_checkpoint_contents(tmp_path, process_group):
    from easyrl.workers.checkpoint import _load_shards, _save_shards, holds_optimizer

    saved = _role(0)
    _save_shards(saved, str(tmp_path / "full"))
    _save_shards(saved, str(tmp_path / "model_only"), model_only=True)
    assert holds_optimizer(str(tmp_path / "full")) and not holds_optimizer(str(tmp_path / "model_only"))
    import torch.distributed.checkpoint as dcp

    keys = set(dcp.FileSystemReader(str(tmp_path / "model_only")).read_metadata().state_dict_metadata)
    assert keys == {"model.weight", "model.bias"}
    fresh = _role(1)
    fresh.optimizer = torch.optim.AdamW(fresh.model.parameters(), lr=0.1)  # never stepped
    _load_shards(fresh, str(tmp_path / "model_only"))
    torch.testing.assert_close(fresh.model.weight, saved.model.weight)
    assert not fresh.optimizer.state  # Adam's moments restart
    resumed = _role(2)
    _load_shards(resumed, str(tmp_path / "full"))  # a full checkpoint restores the moments
    torch.testing.assert_close(next(iter(resumed.optimizer.state.values()))["exp_avg"],
                               next(iter(saved.optimizer.state.values()))["exp_avg"])


def test_override_chat_template(tmp_path):
    from easyrl.testing.tokenizer import build_qwen_tokenizer
    from easyrl.trainer.model_checks import override_chat_template

    tokenizer = build_qwen_tokenizer()
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    override_chat_template(tokenizer, None, str(path))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False)
    assert text == "[user] 1+1?\n"
    with pytest.raises(ConfigError, match="data.override_chat_template"):
        override_chat_template(tokenizer, None, str(tmp_path / "missing.jinja"))


def test_gspo_token_is_gspo():
    from pathlib import Path

    from easyrl.config import load_config
    from easyrl.config.checks import ConfigWarning

    assert POLICY_LOSSES.get("gspo_token") is POLICY_LOSSES.get("gspo")
    demo = f"config={Path(__file__).resolve().parents[1] / 'examples/configs/cpu_demo.yaml'}"
    with pytest.warns(ConfigWarning, match="loss_type=gspo_token with loss_agg_mode=token-mean"):  # as for gspo
        load_config([demo, "worker.actor.model.model_path=m", "worker.actor.loss_type=gspo_token"])


class _CountingRollout:
    """A rollout (``easyrl.trainer.rollout.Rollout``'s interface) answering every prompt with two tokens, that counts
    the prompts of each call; no engine."""

    engines = 1

    def __init__(self):
        self.calls: list[int] = []

    def generate(self, prompts, overrides):
        from easyrl.batch import Batch

        size = len(prompts)
        self.calls.append(size)
        tensors = prompts.tensors.clone()
        tensors["responses"] = torch.full((size, 2), 11)
        tensors["response_mask"] = torch.ones(size, 2, dtype=torch.long)
        tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
        tensors["attention_mask"] = torch.cat([tensors["prompt_mask"], tensors["response_mask"]], dim=1)
        return Batch(tensors, dict(prompts.extras)), 0.0


def _prompt_stream(size: int):
    index = 0
    while True:
        ids = [[1, 2, 3 + index + i] for i in range(size)]
        yield {"prompt_ids": ids, "raw_prompt_ids": ids, "images": [[]] * size, "multi_modal_inputs": [{}] * size,
               "ground_truth": [str(index + i) for i in range(size)], "columns": [{}] * size}
        index += size


@pytest.mark.parametrize("filtering", [False, True])
def test_generation_rounds_of_mini_rollout_batch_size(filtering):
    from easyrl.config import PPOConfig
    from easyrl.testing.tokenizer import build_qwen_tokenizer
    from easyrl.trainer.generation import Generator
    from easyrl.trainer.scoring import Scorer

    config = PPOConfig()
    config.data.rollout_batch_size, config.data.mini_rollout_batch_size, config.worker.rollout.n = 4, 3, 2
    config.algorithm.online_filtering = filtering
    config.worker.reward.timeout_s = None

    def reward(inputs):  # prompts with an even ground truth: one sample right, one wrong (a group kept by filtering)
        return {"overall": [float(int(x["ground_truth"]) % 2 == 0 and i % 2 == 0) for i, x in enumerate(inputs)]}

    rollout = _CountingRollout()
    generator = Generator(config, rollout, Scorer(config.worker.reward, build_qwen_tokenizer(), reward), pad_id=0)
    metrics: dict = {}
    batch, pending, scores, failures = generator.make_batch(_prompt_stream(3), step=1, timing={}, metrics=metrics)
    assert pending is None and failures == 0 and len(batch) == 4 * 2  # rollout_batch_size groups of n
    if filtering:  # groups of prompts 0, 2, 4, 6 kept: three rounds of 3 prompts
        assert rollout.calls == [6, 6, 6] and batch["ground_truth"][::2] == ["0", "2", "4", "6"]
    else:  # rounds kept whole until 4 prompts: 3 + 3, the last two dropped
        assert rollout.calls == [6, 6] and batch["ground_truth"][::2] == ["0", "1", "2", "3"]
    assert metrics["dynamic_sampling/num_gen_batches"] == len(rollout.calls)
    assert len(scores["overall"]) == sum(rollout.calls)  # every generated sample's, for reward/*
    assert "score/overall" in batch and batch["token_level_scores"].shape == (8, 2)


def test_training_steps_count_whole_generation_batches():
    from easyrl.config import PPOConfig

    config = PPOConfig()
    config.data.rollout_batch_size, config.trainer.total_epochs = 4, 1
    assert config.training_steps(9) == 2  # 9 // 4
    config.data.mini_rollout_batch_size = 6
    assert config.training_steps(9) == 1  # one generation batch of 6 prompts per epoch, 6 // 4 steps (EasyR1)
