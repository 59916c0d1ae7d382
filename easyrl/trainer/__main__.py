"""``python -m easyrl.trainer config=config.yaml key=value ...``: parse the config, start Ray, build, train.

A mistake in the user's input (``easyrl.errors.UserError``) ends the command with one line on stderr,
``easyrl: <kind> error: <message>``, and exit status 2, without a traceback (``EASYRL_DEBUG=1`` shows it).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from easyrl.config import ConfigError, PPOConfig, load_config
from easyrl.errors import run_cli

logger = logging.getLogger("easyrl")


def build_trainer(config: PPOConfig):
    """Load tokenizer/processor, datasets and the reward function, start Ray (unless already started) and the workers.

    Returns:
        A ``RayPPOTrainer`` ready to ``fit()``.

    Raises:
        ConfigError: no reward function configured.
    """
    import ray
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from easyrl.data.dataset import RLDataset
    from easyrl.device import detect_device
    from easyrl.rewards.function import RewardFunction
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    model_cfg = config.worker.actor.model
    tok_path = model_cfg.tokenizer_path or model_cfg.model_path
    tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=model_cfg.trust_remote_code)
    hf_config = AutoConfig.from_pretrained(model_cfg.model_path, trust_remote_code=model_cfg.trust_remote_code)
    processor = None
    if getattr(hf_config, "vision_config", None) is not None:
        processor = AutoProcessor.from_pretrained(tok_path, trust_remote_code=model_cfg.trust_remote_code)

    data = config.data

    def dataset(path: str) -> RLDataset:
        return RLDataset(
            path, tokenizer, processor, prompt_key=data.prompt_key, answer_key=data.answer_key,
            image_key=data.image_key, image_dir=data.image_dir, max_prompt_length=data.max_prompt_length,
            format_prompt=data.format_prompt, min_pixels=data.min_pixels, max_pixels=data.max_pixels,
            filter_overlong_prompts=data.filter_overlong_prompts,
        )

    train_dataset = dataset(data.train_files)
    val_dataset = dataset(data.val_files) if data.val_files else None
    reward = config.worker.reward
    if reward.reward_function is None:
        raise ConfigError("worker.reward.reward_function is not set: give path/to/file.py:function_name.")
    reward_fn = RewardFunction(reward.reward_function, reward.reward_function_kwargs, reward.reward_type)

    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    device = config.trainer.device
    if device == "auto":
        device = detect_device(ray.cluster_resources())
    trainer = RayPPOTrainer(config, tokenizer, train_dataset, val_dataset, reward_fn)
    trainer.init_workers(device)
    return trainer


USAGE = """\
usage: python -m easyrl.trainer [config=FILE.yaml] [KEY=VALUE ...]

Train a policy with RL (GRPO, DAPO, Dr.GRPO, GSPO, RLOO, REINFORCE++, ReMax) on Ray + vLLM + FSDP2.

Configuration, later wins:
  1. the defaults of the dataclasses in easyrl/config.py
  2. the YAML file named by config= (optional, at most one)
  3. dotted KEY=VALUE words on the command line, in order (values are read as YAML)

The documented configuration: config.yaml at the repository root lists every key with what it means;
docs/config.md explains how batch sizes relate, docs/errors.md lists every error message.

examples:
  python -m easyrl.trainer config=config.yaml worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct
  python -m easyrl.trainer config=examples/configs/cpu_demo.yaml worker.actor.model.model_path=PATH trainer.max_steps=1

A mistake in the input is reported as one line, 'easyrl: <kind> error: ...', with exit status 2, before any
worker starts where it can be known then; set EASYRL_DEBUG=1 to see its traceback. EASYRL_LOG_LEVEL sets the
log level (default INFO).
"""


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry point; returns the exit status (0, or 2 after a user error, printed without traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(word in ("-h", "--help", "help") for word in argv):
        print(USAGE, end="")
        return 0
    logging.basicConfig(level=os.environ.get("EASYRL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def run() -> int:
        config = load_config(argv)
        build_trainer(config).fit()
        return 0

    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main())
