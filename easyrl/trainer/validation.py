"""The trainer's validation: when to validate (``trainer.val_freq``, after the last step) and a pass over the whole
validation set with ``worker.rollout.val_override_config``, keeping its first samples for the loggers'
tables (``trainer.val_generations_to_log``).

``ValidationMixin`` is a part of :class:`~easyrl.trainer.ray_trainer.RayPPOTrainer`; it uses the trainer's ``config``,
``val_dataset``, ``global_step``, ``training_steps``, ``tokenizer``, ``_val_guard``, ``val_generations`` and its
generation and scoring methods.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from torch.utils.data import DataLoader

from easyrl.batch import Batch
from easyrl.data.dataset import collate_fn
from easyrl.trainer.metrics import generation_rows, timer

__all__ = ["ValidationMixin"]


class ValidationMixin:
    """Validation passes (see the module docstring)."""

    def _should_validate(self) -> bool:
        freq = self.config.trainer.val_freq
        last = self.global_step == self.training_steps
        return self.val_dataset is not None and freq > 0 and (self.global_step % freq == 0 or last)

    def validate(self) -> dict[str, float]:
        """Generate on the whole validation set with ``worker.rollout.val_override_config``; mean of every reward
        name as ``val/reward/<name>``, plus ``val/response_length/mean`` and ``timing_s/validation``."""
        cfg = self.config
        overrides = dict(cfg.worker.rollout.val_override_config)
        n = int(overrides.pop("n", 1))
        timing: dict[str, float] = {}
        sums: dict[str, list[float]] = defaultdict(list)
        lengths: list[float] = []
        batch_size = cfg.data.val_batch_size if cfg.data.val_batch_size > 0 else len(self.val_dataset)
        loader = DataLoader(self.val_dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
        self.val_generations = []
        with timer("validation", timing):
            for round_, features in enumerate(loader):
                batch = self._generate_even(self._prompt_batch(features, n, round_=round_, phase="val"),
                                            overrides=overrides)
                for name, values in self._reward(batch, self._val_guard).items():
                    sums[name].extend(values)
                lengths.extend(batch["response_mask"].sum(-1).float().tolist())
                self._keep_generations(batch)
        metrics = {f"val/reward/{name}": float(np.mean(values)) for name, values in sums.items()}
        metrics["val/response_length/mean"] = float(np.mean(lengths))
        metrics["timing_s/validation"] = timing["validation"]
        return metrics

    def _keep_generations(self, batch: Batch) -> None:
        """Adds ``batch``'s first samples to ``val_generations`` until ``trainer.val_generations_to_log`` are kept."""
        wanted = self.config.trainer.val_generations_to_log - len(self.val_generations)
        self.val_generations.extend(generation_rows(self.tokenizer, batch, wanted))
