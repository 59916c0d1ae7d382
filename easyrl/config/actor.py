"""``worker.actor``, ``worker.ref`` and ``worker.teacher``: the FSDP2-trained policy (its policy loss and KL/entropy
terms, on top of ``TrainedRoleConfig``'s model, optimizer, FSDP, offloading and batch sizes), the frozen reference, and
the frozen teacher of on-policy distillation (``algorithm.distill_coef``, ``algorithm.adv_estimator:
on_policy_distill``; docs/distillation.md): a second checkpoint, sharded and offloaded like the reference policy,
scoring the student's sampled tokens; ``worker.teachers``, several teachers each serving its data sources, and
``teachers_of``, the one place ``worker.teacher`` becomes the one-teacher list; and the checks of the distillation
settings."""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from annotated_types import Gt

from easyrl.config.fields import NON_NEGATIVE, POSITIVE, UNIT, auto, input_path, registered
from easyrl.config.role import OffloadConfig, TrainedRoleConfig
from easyrl.errors import ConfigError, DataError


@dataclass
class RouterReplayConfig:
    """Routing replay for a mixture-of-experts policy (``easyrl.models.router_replay``; docs/algorithms.md,
    "Routing replay")."""

    mode: Literal["disabled", "R2", "R3"] = "disabled"
    """R3 (rollout routing replay, Ma et al. 2025, arXiv:2510.11370): vLLM records the experts its routers chose for
    every token it ran, they travel with the batch (``routed_experts``), and the actor's log-prob and update passes
    send each token to those experts; R2: the old-log-prob pass records the actor's own routing and the update
    replays it (the update's ratio compares log-probs of the same experts); either way the replayed experts' weights
    come from the actor's own router logits. disabled: every forward routes by itself."""

    @property
    def replays_rollout(self) -> bool:
        """The rollout records its routing and the actor replays it (R3)."""
        return self.mode == "R3"

    @property
    def records_old(self) -> bool:
        """The old-log-prob pass records the actor's routing and the update replays it (R2)."""
        return self.mode == "R2"

    @property
    def enabled(self) -> bool:
        """The actor replays a routing (R2 or R3)."""
        return self.mode != "disabled"


@dataclass
class ActorConfig(TrainedRoleConfig):
    """The trained policy: batch sizes (mini-batch in prompts, micro-batches in samples), policy loss, KL/entropy
    terms."""

    clip_ratio_low: Annotated[float, UNIT] = 0.2
    """1: no lower bound on the ratio (CISPO's paper setting; the ratio itself is > 0)."""
    clip_ratio_high: Annotated[float, NON_NEGATIVE] = 0.3
    clip_ratio_dual: Annotated[float, Gt(1)] = 3.0
    """Dual-clip PPO's c > 1 (Ye et al. 2020, Eq. 5)."""
    loss_type: Annotated[str, registered("easyrl.algorithms.policy_losses", "POLICY_LOSSES")] = "vanilla"
    """The policy loss (vanilla: PPO clip with dual-clip; the others in docs/algorithms.md)."""
    tau_positive: Annotated[float, POSITIVE] = 1.0
    """SAPO gate temperature for tokens with a positive advantage (``loss_type: sapo``)."""
    tau_negative: Annotated[float, POSITIVE] = 1.05
    """SAPO gate temperature for tokens with a zero or negative advantage (``loss_type: sapo``)."""
    entropy_coeff: float = 0.0
    router_aux_loss_coef: Annotated[float, NON_NEGATIVE] = 0.0
    """MoE models (Qwen3-MoE, Qwen3-VL-MoE, Qwen3.5-MoE, ...): weight of the router's load-balancing loss (Switch
    Transformer, Fedus et al. 2022, arXiv:2101.03961, Eq. 4-6, as transformers computes it over every token of a
    micro-batch) added to the actor's loss, logged as ``actor/router_aux_loss``; 0: not computed. The released
    Qwen3-MoE checkpoints were pre-trained with 0.001."""
    tis_cap: Optional[Annotated[float, POSITIVE]] = None
    """Truncated importance sampling cap against vLLM's sampled-token log-probs; None disables it."""
    rollout_sync_threshold: Optional[Annotated[float, POSITIVE]] = 0.1
    """Weight-sync check: the run stops before the update when the median over the step's response tokens of
    ``|log p_vLLM - log p_actor|`` (``rollout/log_prob_diff_median``, nats) exceeds it; a correct sync stays far
    below (docs/metrics.md). Checked when vLLM's log-probs are kept (``worker.rollout.calculate_log_probs``) and it
    samples the untruncated distribution (top_p 1, top_k off, temperature > 0), colocated, without
    ``algorithm.bypass_mode`` (``PPOConfig.sync_check_off``; a value set where it is not checked is warned of); None:
    off."""
    clip_cov_ratio: Annotated[float, POSITIVE] = 2e-4
    """``loss_type: clip_cov``: fraction of the micro-batch's tokens whose gradient is detached."""
    clip_cov_lb: float = 1.0
    """``loss_type: clip_cov``: tokens are drawn among those with covariance in (clip_cov_lb, clip_cov_ub)."""
    clip_cov_ub: float = 5.0
    """``loss_type: clip_cov``: upper end of that covariance band."""
    kl_cov_ratio: Annotated[float, POSITIVE] = 2e-4
    """``loss_type: kl_cov``: fraction of the micro-batch's tokens (largest covariance) given the KL penalty."""
    ppo_kl_coef: Annotated[float, NON_NEGATIVE] = 0.1
    """``loss_type: kl_cov``: weight of ``|log pi - log pi_old|`` on those tokens."""
    dro_beta: Optional[Annotated[float, POSITIVE]] = None
    """``loss_type: dro``: weight of the quadratic log-ratio penalty, > 0 (required with dro)."""
    bypass_loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    """``loss_type: bypass_mode``: ppo_clip (PPO's ratio against the engine's log-probs) or reinforce (REINFORCE
    with the rollout_is weights)."""
    rollout_is: Optional[Annotated[str, registered("easyrl.algorithms.rollout_correction", "ROLLOUT_IS_LEVELS")]] = (
        None)
    """Rollout importance sampling: token or sequence (``pi_old / pi_rollout`` per token or per sequence), capped at
    rollout_is_threshold (or IcePop with rollout_is_threshold_lower); None: off (``tis_cap`` is the token TIS
    shortcut). Needs worker.rollout.calculate_log_probs."""
    rollout_is_threshold: Annotated[float, POSITIVE] = 2.0
    """Upper bound of the rollout IS weights (truncation; IcePop's upper bound)."""
    rollout_is_threshold_lower: Optional[Annotated[float, POSITIVE]] = None
    """IcePop: weights outside [rollout_is_threshold_lower, rollout_is_threshold] are set to 0 instead of truncated."""
    rollout_rs: Optional[str] = None
    """Rejection sampling: comma-separated options of ``ROLLOUT_RS_OPTIONS`` (``token_k1``, ``seq_max_k2``, ...);
    tokens (or sequences) whose divergence from the engine exceeds rollout_rs_threshold leave the loss."""
    rollout_rs_threshold: Optional[str] = None
    """One threshold per rollout_rs option (comma-separated) or one for all; k1 options take "lower_upper" ratio
    bounds (e.g. "0.5_2.0"), the others an upper bound (e.g. "0.05")."""
    ulysses_size: Annotated[int, POSITIVE] = 1
    """Sequence parallelism (DeepSpeed-Ulysses, ``easyrl.models.ulysses``): each packed micro-batch is split over this
    many consecutive devices, which attend with a share of the heads each; the actor, the reference and the critic
    (and the teacher) then hold ~1/ulysses_size of a sequence's activations per device, and the batch is shared
    over ``world_size / ulysses_size`` data-parallel groups. Needs ``padding_free``; must divide the device count and
    the model's attention and key/value heads."""
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """Routing replay of an MoE policy (verl's ``actor.router_replay``)."""
    # copied from algorithm.*
    use_kl_loss: bool = auto("algorithm.use_kl_loss", True)
    kl_penalty: str = auto("algorithm.kl_penalty", "low_var_kl")
    kl_coef: float = auto("algorithm.kl_coef", 1e-2)
    disable_kl: bool = auto("algorithm.disable_kl", False)
    temperature: float = auto("worker.rollout.temperature", 1.0)

    def check(self) -> None:
        """The rollout correction's settings agree (one kind of IS, IcePop's bounds in order, a threshold for each
        rejection option), a loss has the setting it needs (``dro_beta``), and LoRA's (``LoraConfig.check``). Raises
        ``ConfigError`` naming the key."""
        from easyrl.algorithms.policy_losses import POLICY_LOSSES
        from easyrl.algorithms.rollout_correction import ROLLOUT_RS_OPTIONS, parse_rs_thresholds

        self.model.lora.check("worker.actor.model.lora")
        if self.rollout_is is not None and self.tis_cap is not None:
            raise ConfigError("worker.actor.tis_cap and worker.actor.rollout_is are both set: tis_cap is token TIS, "
                              "the same as rollout_is=token with rollout_is_threshold=<cap>; keep one.")
        lower = self.rollout_is_threshold_lower
        if lower is not None and lower > self.rollout_is_threshold:
            raise ConfigError(f"worker.actor.rollout_is_threshold_lower={lower} is above rollout_is_threshold="
                              f"{self.rollout_is_threshold}: IcePop keeps weights in [lower, upper].")
        if self.rollout_rs is not None:
            if self.rollout_rs_threshold is None:
                raise ConfigError("worker.actor.rollout_rs needs worker.actor.rollout_rs_threshold (e.g. \"0.5_2.0\" "
                                  "for a k1 option, \"0.05\" for k2/k3).")
            options = [o.strip() for o in self.rollout_rs.split(",") if o.strip()]
            for option in options:
                if option not in ROLLOUT_RS_OPTIONS:
                    raise ConfigError(f"worker.actor.rollout_rs={option!r} is not one of: "
                                      f"{', '.join(ROLLOUT_RS_OPTIONS)}.")
            try:
                parse_rs_thresholds(options, self.rollout_rs_threshold)
            except ValueError as e:
                raise ConfigError(f"worker.actor.rollout_rs_threshold: {e}") from None
        if POLICY_LOSSES.trait(self.loss_type, "needs_dro_beta") and self.dro_beta is None:
            raise ConfigError(f"worker.actor.loss_type={self.loss_type} needs worker.actor.dro_beta (> 0, the weight "
                              "of the quadratic log-ratio penalty).")


@dataclass
class RefConfig:
    """The frozen reference policy (built only when a KL term uses it)."""

    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    micro_batch_size_per_device_for_experience: int = auto(
        "worker.actor.micro_batch_size_per_device_for_experience", 16)


@dataclass
class TeacherModelConfig:
    """The teacher's checkpoint. Its tokenizer must be the student's (same ids for the same tokens, same special
    tokens and chat template): checked before the workers start (``easyrl.trainer.model_checks``)."""

    model_path: Optional[str] = input_path()
    """A hub id or local folder in Hugging Face format (a causal LM), e.g. Qwen/Qwen3-8B for a Qwen3-1.7B student."""
    tokenizer_path: Optional[str] = input_path()
    """Defaults to ``model_path``; only read for the compatibility check."""
    trust_remote_code: bool = False


@dataclass
class TeacherConfig:
    """The frozen teacher model (built only when ``algorithm.needs_teacher``)."""

    model: TeacherModelConfig = field(default_factory=TeacherModelConfig)
    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    """As ``worker.ref.offload``: the teacher's shard stays on the host and is brought to the device block by
    block for its pass (ignored on the CPU)."""
    micro_batch_size_per_device_for_experience: int = auto(
        "worker.actor.micro_batch_size_per_device_for_experience", 16)


@dataclass
class RoutedTeacherConfig:
    """One teacher of ``worker.teachers`` (several teachers, docs/distillation.md "Several teachers"): a checkpoint and
    its offloading as ``worker.teacher``'s, and the data sources whose samples it scores (a dataset row's
    ``data_source`` column). Its micro-batch is ``worker.teacher.micro_batch_size_per_device_for_experience``."""

    model: TeacherModelConfig = field(default_factory=TeacherModelConfig)
    offload: OffloadConfig = field(default_factory=lambda: OffloadConfig(offload_params=True))
    """As ``worker.teacher.offload``."""
    data_sources: list[str] = field(default_factory=list)
    """The ``data_source`` values of the rows this teacher scores (verl's per-teacher ``domain``, a list here); a
    source is served by one teacher only."""
    default: bool = False
    """Also score every row whose source no teacher names (rows without a ``data_source`` column too); at most one
    teacher is the default. Without one, every source of the training set must be named (checked before Ray)."""


@dataclass(frozen=True)
class Teacher:
    """One teacher of the run as the workers, the sizing and the checks read it (:func:`teachers_of`)."""

    name: str
    """``teacher`` for ``worker.teacher``; the mapping key for ``worker.teachers.<name>`` (its metric
    ``distill/reverse_kl/<name>``)."""
    key: str
    """Its config section: ``worker.teacher`` or ``worker.teachers.<name>`` (for messages)."""
    model: TeacherModelConfig
    offload: OffloadConfig
    data_sources: tuple[str, ...] = ()
    default: bool = True

    @property
    def label(self) -> str:
        """How phases, memory items and metrics name it: ``teacher`` (``worker.teacher``), ``teacher <name>``
        (``worker.teachers.<name>``)."""
        return "teacher" if self.key == "worker.teacher" else f"teacher {self.name}"


def teachers_of(worker: Any) -> list[Teacher]:
    """The run's teachers in order, index = position (the one place the single teacher becomes a list):
    ``worker.teachers``' entries, else ``worker.teacher`` as the one default teacher named ``teacher``; ``[]`` when
    neither names a model. ``worker``: a ``WorkerConfig``."""
    if worker.teachers:
        return [Teacher(str(name), f"worker.teachers.{name}", t.model, t.offload, tuple(map(str, t.data_sources)),
                        t.default) for name, t in worker.teachers.items()]
    if worker.teacher.model.model_path:
        return [Teacher("teacher", "worker.teacher", worker.teacher.model, worker.teacher.offload)]
    return []


def teacher_of_source(teachers: list[Teacher], source: Any) -> Optional[int]:
    """Index in ``teachers`` of the teacher serving data source ``source`` (a row's ``data_source``, None for a row
    without one): the teacher naming it, else the default teacher, else None (no teacher serves it)."""
    for index, teacher in enumerate(teachers):
        if source is not None and str(source) in teacher.data_sources:
            return index
    return next((index for index, teacher in enumerate(teachers) if teacher.default), None)


def route_teachers(teachers: list[Teacher], sources: list[Any]) -> list[int]:
    """Each row's teacher index (``(bsz,)`` ints into ``teachers``) from the rows' ``data_source`` values
    (``sources``: ``(bsz,)``, None for a row without one). Raises ``DataError`` naming the first source no teacher
    serves, the row and the keys to set (the training set is checked before Ray: ``easyrl.trainer.preflight``)."""
    routed = [teacher_of_source(teachers, source) for source in sources]
    for row, (source, index) in enumerate(zip(sources, routed)):
        if index is None:
            raise DataError(unserved_source(teachers, source, f"row {row}"))
    return routed  # type: ignore[return-value]  # no None left


def unserved_source(teachers: list[Teacher], source: Any, where: str) -> str:
    """The message for data source ``source`` (at ``where``: file and row) that no teacher of ``teachers`` serves."""
    named = ", ".join(f"{t.key}.data_sources={list(t.data_sources)}" for t in teachers)
    return (f"{where} has data_source={source!r}, which no teacher serves ({named}), and there is no default "
            "teacher: add it to one teacher's data_sources, or set worker.teachers.<name>.default=true for one.")


def check_teachers(config: Any) -> None:
    """``worker.teachers`` of a finalized ``PPOConfig``: only with distillation on and without ``worker.teacher``,
    each with a model and at least one source (or the default), no source named by two teachers, at most one
    default. Raises ``ConfigError`` naming the keys."""
    worker, algo = config.worker, config.algorithm
    if not worker.teachers:
        return
    names = f"worker.teachers ({', '.join(map(str, worker.teachers))})"
    if not algo.needs_teacher:
        raise ConfigError(f"{names} is set but distillation is off (algorithm.distill_coef=0, "
                          f"algorithm.adv_estimator={algo.adv_estimator}): no teacher would be loaded. Set "
                          "algorithm.distill_coef > 0 or algorithm.adv_estimator=on_policy_distill, or remove "
                          "worker.teachers.")
    if worker.teacher.model.model_path:
        raise ConfigError(f"worker.teacher.model.model_path and {names} are both set: give one "
                          "teacher as worker.teacher, or every teacher under worker.teachers.")
    teachers = teachers_of(worker)
    served: dict[str, str] = {}
    for teacher in teachers:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", teacher.name):
            raise ConfigError(f"worker.teachers has a teacher named {teacher.name!r}: a name is letters, digits, '_' "
                              "and '-' (it is a key of dotted overrides, worker.teachers.<name>.model.model_path, "
                              "and of the distill/reverse_kl/<name> metric): rename it, e.g. "
                              f"{re.sub(r'[^A-Za-z0-9_-]', '_', teacher.name)!r}.")
        if not teacher.model.model_path:
            raise ConfigError(f"{teacher.key}.model.model_path is not set: give the teacher's hub id or local folder "
                              "(it must share the actor's tokenizer).")
        if not teacher.data_sources and not teacher.default:
            raise ConfigError(f"{teacher.key} serves no data source: list the data_source values of its rows in "
                              f"{teacher.key}.data_sources, or set {teacher.key}.default=true.")
        for source in teacher.data_sources:
            if source in served:
                raise ConfigError(f"data_source {source!r} is served by two teachers ({served[source]}.data_sources "
                                  f"and {teacher.key}.data_sources): name each source in one teacher only.")
            served[source] = teacher.key
    defaults = [t.key for t in teachers if t.default]
    if len(defaults) > 1:
        raise ConfigError(f"{' and '.join(f'{key}.default=true' for key in defaults)}: at most one teacher is the "
                          "default for the sources no teacher names.")


def check_distillation(config: Any) -> None:
    """The distillation settings of a finalized ``PPOConfig``: a teacher checkpoint when distillation is on
    (``worker.teachers`` as :func:`check_teachers` says), and one way of mixing (the pure estimator
    ``on_policy_distill`` or a coefficient on another estimator, not both). Raises ``ConfigError`` naming the key, the
    value and what to write instead."""
    algo = config.algorithm
    pure = algo.estimator("needs_teacher")
    if pure and algo.distill_coef > 0:
        raise ConfigError(
            f"algorithm.adv_estimator={algo.adv_estimator} is pure distillation (advantage = -reverse KL) and "
            f"algorithm.distill_coef={algo.distill_coef} would add the reverse KL a second time: set "
            "algorithm.distill_coef=0, or choose an RL estimator (e.g. grpo) to mix it with the RL advantage.")
    check_teachers(config)
    if algo.needs_teacher and not teachers_of(config.worker):
        why = f"algorithm.adv_estimator={algo.adv_estimator}" if pure else f"algorithm.distill_coef={algo.distill_coef}"
        raise ConfigError(f"{why} distills from a teacher, but worker.teacher.model.model_path is not set: give the "
                          "teacher's hub id or local folder (it must share the actor's tokenizer), or several "
                          "teachers as worker.teachers.<name> (docs/distillation.md).")
