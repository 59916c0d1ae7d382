"""The trainer's validation: when (``trainer.val_freq``, after the last step) and a pass over the validation set."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

import numpy as np
from tensordict import TensorDict
from torch.utils.data import DataLoader

from easyrl.batch import Batch
from easyrl.data.dataset import collate_fn
from easyrl.trainer.generation import Generator
from easyrl.trainer.metrics import generation_rows, timer
from easyrl.trainer.multi_turn import multi_turn_metrics
from easyrl.trainer.scoring import ModelRewards, Scorer

__all__ = ["Validator"]


class Validator:
    """Validation passes over ``dataset`` (None: none); owns ``generations``, the last pass's first samples.
    ``model_rewards`` run after the validation reward, as in training."""

    def __init__(self, config, dataset, generator: Generator, scorer: Scorer, tokenizer,
                 model_rewards: Optional[ModelRewards] = None):
        self.config = config
        self.dataset = dataset
        self.generator = generator
        self.scorer = scorer
        self.model_rewards = model_rewards
        self.tokenizer = tokenizer
        self.generations: list[dict[str, Any]] = []

    def due(self, step: int, total_steps: int) -> bool:
        """Whether to validate after ``step`` of ``total_steps``: every ``trainer.val_freq`` steps, and the last."""
        freq = self.config.trainer.val_freq
        return self.dataset is not None and freq > 0 and (step % freq == 0 or step == total_steps)

    def run(self, step: int) -> dict[str, float]:
        """Generate on the whole validation set with ``worker.rollout.val_override_config``: ``val/reward/<name>``
        (means), ``val/response_length/mean``, ``timing_s/validation`` and, multi-turn, ``val/multi_turn/*``."""
        cfg = self.config
        overrides = dict(cfg.worker.rollout.val_override_config)
        n = int(overrides.pop("n", 1))
        timing: dict[str, float] = {}
        sums: dict[str, list[float]] = defaultdict(list)
        lengths: list[float] = []
        agent_stats: list[dict[str, Any]] = []  # multi-turn trajectories' counts (easyrl.trainer.multi_turn)
        batch_size = cfg.data.val_batch_size if cfg.data.val_batch_size > 0 else len(self.dataset)
        loader = DataLoader(self.dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
        self.generations = []
        with timer("validation", timing):
            for round_, features in enumerate(loader):
                prompts = self.generator.prompt_batch(features, n, step, round_=round_, phase="val")
                batch = self.generator.generate_even(prompts, overrides=overrides)
                self.scorer.score(batch, step, validation=True)
                if self.model_rewards is not None:
                    self.model_rewards.run(batch, {}, {})
                for key in [key for key in batch.extras if key.startswith("score/")]:
                    sums[key.removeprefix("score/")].extend(batch[key])
                lengths.extend(batch["response_mask"].sum(-1).float().tolist())
                agent_stats.extend(batch["multi_turn_stats"] if "multi_turn_stats" in batch else [])
                wanted = cfg.trainer.val_generations_to_log - len(self.generations)  # the first samples, logged
                self.generations.extend(generation_rows(self.tokenizer, batch, wanted))
        metrics = {f"val/reward/{name}": float(np.mean(values)) for name, values in sums.items()}
        metrics["val/response_length/mean"] = float(np.mean(lengths))
        metrics["timing_s/validation"] = timing["validation"]
        if agent_stats:
            stats = Batch(TensorDict({}, batch_size=[len(agent_stats)]), {"multi_turn_stats": agent_stats})
            metrics.update({f"val/{key}": value for key, value in multi_turn_metrics(stats).items()})
        return metrics
