"""Which ranks share a vLLM engine under rollout tensor parallelism, and which prompts each engine samples.

With ``worker.rollout.tensor_parallel_size = tp`` the ``world`` ranks form ``world / tp`` groups of ``tp``
consecutive ranks (as vLLM's ``external_launcher`` builds them: TP fastest), each running ONE engine on the same
requests (SPMD). Dispatch: the batch is cut into ``world / tp`` equal consecutive shares, replica ``rank // tp``
samples its share on every rank. Collection: only each group's first rank's result is kept, in replica order. With
node-contiguous ranks a group stays within a node when ``tp`` divides ``trainer.n_gpus_per_node``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from easyrl.config.checks import check_tensor_parallel
from easyrl.models.families import text_config

T = TypeVar("T")


@dataclass(frozen=True)
class RolloutLayout:
    """The rollout's TP groups over ``world_size`` ranks; raises ``ConfigError`` unless ``tensor_parallel_size``
    divides ``world_size``."""

    world_size: int
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_tensor_parallel(self.world_size, self.tensor_parallel_size)

    @property
    def dp_size(self) -> int:
        """The number of engines (rollout data-parallel replicas), ``world_size / tensor_parallel_size``."""
        return self.world_size // self.tensor_parallel_size

    def dp_rank(self, rank: int) -> int:
        """The replica (engine) that ``rank`` belongs to, ``rank // tensor_parallel_size``."""
        return rank // self.tensor_parallel_size

    def tp_rank(self, rank: int) -> int:
        """``rank``'s place within its engine, ``rank % tensor_parallel_size``."""
        return rank % self.tensor_parallel_size

    def groups(self) -> list[list[int]]:
        """The ranks of each engine, in replica order: ``[[0, .., tp - 1], [tp, .., 2 tp - 1], ...]``."""
        tp = self.tensor_parallel_size
        return [list(range(d * tp, (d + 1) * tp)) for d in range(self.dp_size)]

    def dispatch(self, shares: Sequence[T]) -> list[T]:
        """Per rank, in rank order, the share its replica samples (``shares``: one per replica, ``dp_size`` of them,
        else ``ValueError``)."""
        if len(shares) != self.dp_size:
            raise ValueError(f"{len(shares)} shares for {self.dp_size} rollout replicas")
        return [shares[self.dp_rank(rank)] for rank in range(self.world_size)]

    def collect(self, per_rank: Sequence[T]) -> list[T]:
        """Each replica's result once, in replica order: the first rank's of every group (``per_rank``: one per rank,
        ``world_size`` of them, else ``ValueError``)."""
        if len(per_rank) != self.world_size:
            raise ValueError(f"{len(per_rank)} results for {self.world_size} ranks")
        return [per_rank[group[0]] for group in self.groups()]


def split_head_counts(hf_config: Any) -> dict[str, int]:
    """The head counts of a Hugging Face config that vLLM's TP splits, by dotted name: the text model's
    ``num_attention_heads`` / ``num_key_value_heads``, Gated DeltaNet's ``linear_num_key_heads`` /
    ``linear_num_value_heads``, the vision tower's ``num_heads``; those the config has."""
    counts: dict[str, int] = {}
    text = text_config(hf_config)
    prefix = "text_config." if text is not hf_config else ""
    for name in ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"):
        if isinstance(getattr(text, name, None), int):
            counts[prefix + name] = getattr(text, name)
    vision = getattr(hf_config, "vision_config", None)
    if isinstance(getattr(vision, "num_heads", None), int):
        counts["vision_config.num_heads"] = vision.num_heads
    return counts


def check_heads_split(hf_config: Any, tensor_parallel_size: int) -> None:
    """Raise ``ValueError`` unless vLLM can split the model's heads over ``tensor_parallel_size`` ranks: every head
    count divisible by it, except the KV heads, which vLLM replicates when there are fewer of them than ranks (then
    the ranks must be a multiple of them). vLLM itself would say so only after every worker has loaded the model."""
    tp = tensor_parallel_size
    for name, count in split_head_counts(hf_config).items():
        kv = name.endswith("num_key_value_heads")
        if (tp % count if kv and tp > count else count % tp) != 0:
            rule = "divide it or be a multiple of it" if kv else "divide it"
            raise ValueError(
                f"worker.rollout.tensor_parallel_size={tp} cannot split the model's {name}={count} over the ranks of "
                f"one vLLM engine: it must {rule} (and divide the device count)."
            )
