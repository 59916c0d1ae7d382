"""Pre-flight checks of the options that name parts of the actor's model (``worker.actor.model``:
``freeze_vision_tower``, ``lora.target_modules``, ``lora.exclude_modules``), written for Qwen, against the modules the
model really holds: its skeleton built on the meta device as the worker builds it
(``easyrl.workers.fsdp_model.build_empty_model``), LoRA inserted by the worker's own ``apply_lora``. Each refuses,
before Ray, a setting that would do nothing on the family, naming the family and what it has instead
(docs/errors.md, M28-M30). The worker's freezing and LoRA wrapping are not changed here."""

from __future__ import annotations

import copy
import logging
import re
import warnings
from typing import Any

from easyrl.errors import ConfigError
from easyrl.trainer.model_checks import weight_headers

logger = logging.getLogger("easyrl")

KEY = "worker.actor.model"
TOWER = re.compile(r"visual|vision")  # a child of the model named as its vision tower
PROJECTOR = re.compile(r"projector|connector")  # the tower's projector into the text model, beside it


def check_model_parts(model_cfg: Any, hf_config: Any) -> None:
    """The actor's part-naming options against its meta-built skeleton, only when one is set
    (``freeze_vision_tower``, or LoRA with ``rank > 0``): :func:`check_tower_freeze`, then, with LoRA inserted,
    :func:`check_lora_modules` and :func:`check_lora_tower`. A skeleton that cannot be built is left to the
    workers."""
    lora = model_cfg.lora
    if not model_cfg.freeze_vision_tower and lora.rank == 0:
        return
    model = model_skeleton(hf_config, model_cfg.trust_remote_code)
    if model is None:
        return
    towers = tower_paths(model)
    check_tower_freeze(model_cfg, hf_config, model, towers)
    if lora.rank == 0:
        return
    linear = linear_layers(model)
    from easyrl.models.lora import apply_lora

    with warnings.catch_warnings():  # peft's notes on the wrapping are the worker's to print
        warnings.simplefilter("ignore")
        apply_lora(model, lora)  # the worker's wrapping, on the throwaway skeleton (ModelError: peft refuses a target)
    shapes = weight_headers(f"{KEY}.model_path", model_cfg.model_path) or {}  # the checkpoint's names, for messages
    check_lora_modules(model_cfg, hf_config, model, linear, shapes, tuple(towers))
    check_lora_tower(model_cfg, hf_config, model, towers)


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


def tower_paths(model: Any) -> list[str]:
    """The vision tower's module path(s): the children of the model's inner ``model`` (or of the model) named like a
    tower (``model.visual``, ``model.vision_tower``, ``model.vision_model``); empty for a text model."""
    inner = getattr(model, "model", None)
    holder, prefix = (inner, "model.") if inner is not None else (model, "")
    return [prefix + name for name, _ in holder.named_children() if TOWER.search(name)]


def projector_paths(model: Any) -> list[str]:
    """The children of the model's inner ``model`` named as the tower's projector (``model.multi_modal_projector``,
    Idefics3's ``model.connector``): what Qwen-VL holds inside its tower (``model.visual.merger``)."""
    inner = getattr(model, "model", None)
    return [f"model.{name}" for name, _ in inner.named_children() if PROJECTOR.search(name)] if inner else []


def linear_layers(model: Any) -> list[str]:
    """The full names of the model's linear layers but the output head (before LoRA is inserted)."""
    import torch

    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")]


def _matches(name: str, target: str) -> bool:
    """peft's rule for a name of a ``target_modules`` list: the module's full name or its dotted suffix."""
    return name == target or name.endswith(f".{target}")


def check_tower_freeze(model_cfg: Any, hf_config: Any, model: Any, towers: list[str]) -> None:
    """``freeze_vision_tower`` freezes ``model.visual`` (Qwen-VL's tower) only: on a model without it (a text model;
    InternVL, LLaVA-OneVision and Mistral 3's ``model.vision_tower``, Idefics3's ``model.vision_model``) it would
    freeze nothing. Raises ``ConfigError`` naming the key, the family and its tower (M28)."""
    from easyrl.workers.fsdp_model import FROZEN_TOWER, frozen_tower

    if not model_cfg.freeze_vision_tower or frozen_tower(model) is not None:
        return
    label, key = family_label(hf_config), f"{KEY}.freeze_vision_tower=true"
    if not towers:
        raise ConfigError(f"{key}: {label} has no vision tower (a text model), so nothing would be frozen; set "
                          f"{KEY}.freeze_vision_tower=false")
    raise ConfigError(f"{key} freezes Qwen-VL's vision tower ({FROZEN_TOWER}), which {label} does not have: its tower "
                      f"is {', '.join(towers)}, and it would be trained with the rest. Set "
                      f"{KEY}.freeze_vision_tower=false (to keep the tower's weights as they are, train with LoRA and "
                      f"exclude it: {KEY}.lora.exclude_modules='{exclude_pattern(model, towers)}')")


def exclude_pattern(model: Any, towers: list[str]) -> str:
    """The ``lora.exclude_modules`` that keeps the family's tower and its projector without adapters, as
    ``.*visual.*`` does for Qwen-VL: ``.*(vision_tower|multi_modal_projector).*``."""
    leaves = [path.rsplit(".", 1)[-1] for path in towers + projector_paths(model)]
    return f".*{leaves[0]}.*" if len(leaves) == 1 else f".*({'|'.join(leaves)}).*"


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


def check_lora_tower(model_cfg: Any, hf_config: Any, model: Any, towers: list[str]) -> None:
    """LoRA's default ``exclude_modules`` (``.*visual.*``) keeps adapters off Qwen-VL's tower (``model.visual``); on
    a family whose tower is named otherwise (``model.vision_tower``, ``model.vision_model``) it excludes nothing and
    the tower gets adapters. Raises ``ConfigError`` naming the family's tower and the pattern to write (M30); a
    pattern of the user's own, or null, is taken as written."""
    from peft.tuners.lora import LoraLayer

    from easyrl.config.role import LoraConfig
    from easyrl.workers.fsdp_model import FROZEN_TOWER

    lora = model_cfg.lora
    if lora.exclude_modules != LoraConfig().exclude_modules or not towers:
        return
    adapted = [name for name, module in model.named_modules() if isinstance(module, LoraLayer)
               and any(name.startswith(f"{tower}.") for tower in towers)]
    if adapted:
        raise ConfigError(f"{KEY}.lora.exclude_modules={lora.exclude_modules!r} keeps adapters off Qwen-VL's vision "
                          f"tower ({FROZEN_TOWER}); {family_label(hf_config)}'s tower is {', '.join(towers)}, which "
                          f"it does not match, so LoRA would adapt {len(adapted)} of the tower's layers (e.g. "
                          f"{adapted[0]}). Write {KEY}.lora.exclude_modules='{exclude_pattern(model, towers)}' to "
                          "keep the tower and its projector without adapters, or null to adapt them")
