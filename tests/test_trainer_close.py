"""``RayPPOTrainer.close``: the run's parts ended once, in order (what generates ahead, the rollout's background, the
placement's stream, then the workers), whatever kind each part is; a trainer whose start-up stopped half-way closes
what it made."""

from __future__ import annotations

from types import SimpleNamespace


class _Part:
    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def close(self) -> None:
        self.log.append(self.name)

    def shutdown(self) -> None:
        self.log.append(f"{self.name} shutdown")


def _trainer(log: list[str], generator: bool = True):
    from easyrl.trainer.ray_trainer import RayPPOTrainer

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the parts alone: no Ray, no models
    trainer.batches = _Part("batches", log) if generator else None
    trainer.generator = SimpleNamespace(rollout=_Part("rollout", log)) if generator else None
    trainer.placement, trainer.workers = _Part("placement", log), _Part("workers", log)
    return trainer


def test_close_ends_every_part_once_and_the_workers_last():
    log: list[str] = []
    trainer = _trainer(log)
    trainer.close()
    trainer.close()  # a second call: nothing more
    assert log == ["batches", "rollout", "placement", "workers shutdown"]


def test_a_start_up_stopped_before_the_rollout_closes_what_it_made():
    log: list[str] = []
    _trainer(log, generator=False).close()
    assert log == ["placement", "workers shutdown"]


def test_every_rollout_kind_can_be_closed():
    """The trainer calls ``close`` on whichever rollout the placement made (``Rollout.close``)."""
    from easyrl.trainer.agent_rollout import AgentRollout
    from easyrl.trainer.multi_turn import MultiTurnRollout
    from easyrl.trainer.placement import NoRollout
    from easyrl.trainer.request_stream import StreamingRollout
    from easyrl.trainer.rollout import SingleTurnRollout

    for kind in (SingleTurnRollout, StreamingRollout, MultiTurnRollout, AgentRollout, NoRollout):
        assert callable(getattr(kind, "close", None)), kind.__name__
