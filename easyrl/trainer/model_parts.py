"""Pre-flight checks of the options that name parts of the actor's model (``worker.actor.model``:
``freeze_vision_tower``, ``lora.target_modules``, ``lora.exclude_modules``), resolved through the family's
registry entry (``easyrl.models.families.vision_parts``), against the modules the model really holds: its skeleton
built on the meta device as the worker builds it (``easyrl.workers.fsdp_model.build_empty_model``), LoRA inserted
by the worker's own ``apply_lora``. Each refuses, before Ray, a setting that would do nothing on the family, naming
the family and what it has instead, or says in one line what a setting resolves to (docs/errors.md, M28-M30, W25)."""

from __future__ import annotations

import copy
import logging
import re
import warnings
from typing import Any

from easyrl.errors import ConfigError
from easyrl.models.families import vision_parts
from easyrl.trainer.model_checks import weight_headers

logger = logging.getLogger("easyrl")

KEY = "worker.actor.model"


def check_model_parts(model_cfg: Any, hf_config: Any, key: str = KEY) -> None:
    """A trained role's part-naming options (``key``: the actor's ``worker.actor.model``, or the critic's) against
    its meta-built skeleton, only when one is set (``freeze_vision_tower``, or LoRA with ``rank > 0``, the actor's
    only: the critic's is refused at config load): :func:`check_tower_freeze`, then, with LoRA inserted,
    :func:`check_lora_modules`, :func:`report_lora_tower` and :func:`report_untrained_experts`. A skeleton that
    cannot be built is left to the workers."""
    lora = model_cfg.lora
    if not model_cfg.freeze_vision_tower and lora.rank == 0:
        return
    model = model_skeleton(hf_config, model_cfg.trust_remote_code)
    if model is None:
        return
    towers, _ = vision_parts(model)
    check_tower_freeze(model_cfg, hf_config, towers, key)
    if lora.rank == 0:
        return
    linear = linear_layers(model)
    from easyrl.models.lora import apply_lora

    with warnings.catch_warnings():  # peft's notes on the wrapping are the worker's to print
        warnings.simplefilter("ignore")
        apply_lora(model, lora)  # the worker's wrapping, on the throwaway skeleton (ModelError: peft refuses a target)
    shapes = weight_headers(f"{KEY}.model_path", model_cfg.model_path) or {}  # the checkpoint's names, for messages
    check_lora_modules(model_cfg, hf_config, model, linear, shapes, tuple(towers))
    report_lora_tower(model_cfg, hf_config, model)
    report_untrained_experts(hf_config, model)


def model_skeleton(hf_config: Any, trust_remote_code: bool) -> Any:
    """The actor's modules on the meta device, as its worker builds them (no memory); None if they cannot be built
    (the workers' load says why)."""
    import torch

    from easyrl.models.hf_folder import supports_sdpa
    from easyrl.workers.fsdp_model import build_empty_model

    try:
        attn = "sdpa" if supports_sdpa(hf_config) else "eager"
        return build_empty_model(copy.deepcopy(hf_config), torch.float32, trust_remote_code, attn)
    except Exception as err:  # noqa: BLE001 - the modeling code's own checks, whatever they raise
        logger.debug("no meta skeleton of %s for the part checks: %s", getattr(hf_config, "model_type", "?"), err)
        return None


def family_label(hf_config: Any) -> str:
    """``<registry name> (<model_type>)``, e.g. ``InternVL 3 (transformers format) (internvl)``."""
    from easyrl.models.families import family

    model_type = getattr(hf_config, "model_type", None)
    name = family(hf_config).name
    return f"{name} ({model_type})" if name != "unlisted" else repr(model_type)


def linear_layers(model: Any) -> list[str]:
    """The full names of the model's linear layers but the output head (before LoRA is inserted)."""
    import torch

    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")]


def _matches(name: str, target: str) -> bool:
    """peft's rule for a name of a ``target_modules`` list: the module's full name or its dotted suffix."""
    return name == target or name.endswith(f".{target}")


def check_tower_freeze(model_cfg: Any, hf_config: Any, towers: list[str], key: str = KEY) -> None:
    """``<key>.freeze_vision_tower`` freezes the family's vision tower (``easyrl.models.families.vision_parts``); on
    a model without one (a text model) it would freeze nothing. Raises ``ConfigError`` naming the key and the family
    (M28)."""
    if model_cfg.freeze_vision_tower and not towers:
        raise ConfigError(f"{key}.freeze_vision_tower=true: {family_label(hf_config)} has no vision tower (a text "
                          f"model), so nothing would be frozen; set {key}.freeze_vision_tower=false")


def check_lora_modules(model_cfg: Any, hf_config: Any, model: Any, linear: list[str],
                       shapes: dict[str, list[int]], towers: tuple[str, ...] = ()) -> None:
    """After ``apply_lora`` on the skeleton: every adapter sits on a layer (no peft ``ParamWrapper``: the fused
    experts, or a router, adapted as a parameter, which easyrl's merge into vLLM's weights cannot take), and every
    name of ``lora.target_modules`` got one (a checkpoint's per-expert name, such as Granite-MoE's ``input_linear``,
    may match no module transformers builds: peft then adapts the other names, silently). Names the checkpoint does
    not have at all are M19's (``model_checks.check_lora_targets``). Raises ``ConfigError`` naming the family, the
    targets and the linear layers it has (M29)."""
    from peft.tuners.lora import LoraLayer, ParamWrapper

    lora = model_cfg.lora
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    label, key = family_label(hf_config), f"{KEY}.lora.target_modules={lora.target_modules!r}"
    leaves = sorted({name.rsplit(".", 1)[-1] for name in linear
                     if not any(name.startswith(f"{tower}.") for tower in towers)})
    have = f"its linear layers are {', '.join(leaves)}" if leaves else "it has no linear layer outside its tower"
    fused = sorted({re.sub(r"\.\d+\.", ".N.", f"{name.replace('.base_layer', '')}.{module.parameter_name}")
                    for name, module in layers.items() if isinstance(module, ParamWrapper)})
    if fused:
        raise ConfigError(f"{key}: {label} holds its experts fused, as parameters and not linear layers "
                          f"({', '.join(fused[:4])}), which peft adapts as parameters and easyrl's merge into vLLM's "
                          f"weights cannot take (it merges the adapters of linear layers): the experts cannot be "
                          f"trained with LoRA. Target linear layers only; {have} (e.g. the attention projections "
                          "q_proj,k_proj,v_proj,o_proj)")
    if lora.target_modules.strip() == "all-linear":
        return
    from easyrl.models.lora import target_modules

    missed = [t for t in target_modules(lora.target_modules) if not any(_matches(name, t) for name in layers)]
    excluded = [name for name in linear if missed and _matches(name, missed[0])]
    if excluded:
        raise ConfigError(f"{key}: {missed[0]!r} names only layers that {KEY}.lora.exclude_modules="
                          f"{lora.exclude_modules!r} leaves without adapters (e.g. {excluded[0]}), so it adapts "
                          f"nothing; drop it, or change exclude_modules; {have}")
    if missed:
        found = [name for name in shapes if f".{missed[0]}." in f".{name}"]
        where = f" (the checkpoint's {found[0]})" if found else ""
        raise ConfigError(f"{key}: {label} as transformers builds it holds no linear layer named {missed}{where}, "
                          "so peft would put no adapter there and it would stay untrained; "
                          f"{have} (or give all-linear)")


def report_lora_tower(model_cfg: Any, hf_config: Any, model: Any) -> None:
    """One line where LoRA's default ``exclude_modules`` (``.*visual.*``, the vision tower) is resolved to the
    family's own tower and projector (``easyrl.models.lora.excluded_modules``: InternVL's ``model.vision_tower``,
    ...), so that the pattern the adapter is made with is on the screen (M30)."""
    from easyrl.models.lora import excluded_modules

    lora = model_cfg.lora
    exclude = excluded_modules(lora, model)
    if exclude != lora.exclude_modules:
        logger.info("%s.lora.exclude_modules=%r (the vision tower) is %r for %s: its tower and projector stay "
                    "without adapters", KEY, lora.exclude_modules, exclude, family_label(hf_config))


def report_untrained_experts(hf_config: Any, model: Any) -> None:
    """One warning where LoRA is on for a model that holds its routed experts fused, as ``(experts, ...)``
    parameters (``mlp.experts.gate_up_proj``, transformers 5): peft adapts linear layers, so the experts keep the
    base model's weights while attention, the router and a shared expert train (W25)."""
    fused = sorted({re.sub(r"\.\d+\.", ".N.", name) for name, param in model.named_parameters()
                    if param.ndim == 3 and ".experts." in f".{name}"})
    if fused:
        logger.warning("%s.lora: %s holds its routed experts fused, as parameters (%s), which LoRA does not adapt: "
                       "they stay untrained (the base model's weights); attention, the router and any shared expert "
                       "train. Full fine-tuning (lora.rank=0) trains them", KEY, family_label(hf_config),
                       ", ".join(fused[:2]))
