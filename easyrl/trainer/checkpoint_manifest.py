"""``manifest.json``, written last into each checkpoint (this run's identity: ranks, optimizer, LoRA rank, critic, the
model's shape; every file's size), and :func:`check_checkpoint`, the refusal at resume, before any worker loads, of a
checkpoint that is truncated or does not fit this run (docs/checkpoints.md)."""

from __future__ import annotations

import json
import os
from typing import Any

from easyrl.errors import RunStateError

MANIFEST = "manifest.json"
OPTIMIZER = "AdamW"  # the one easyrl builds (workers/policy.py, workers/critic.py)
MODEL_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")
_SETTINGS = {  # manifest key -> how the message names it
    "world_size": "ranks (trainer.nnodes * trainer.n_gpus_per_node)",
    "optimizer": "optimizer",
    "actor_lora_rank": "worker.actor.model.lora.rank (which parameters the optimizer holds)",
    "critic": "a critic (algorithm.adv_estimator=gae)",
}


def model_fingerprint(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The :data:`MODEL_KEYS` entries of a ``config.json`` dict (its ``text_config`` fills what the top lacks)."""
    text = hf_config.get("text_config") or {}
    found = {key: hf_config.get(key, text.get(key)) for key in MODEL_KEYS}
    return {key: value for key, value in found.items() if value is not None}


def run_identity(config) -> dict[str, Any]:
    """This run's ranks, optimizer, LoRA rank, critic and model fingerprint (``worker.actor.model.model_path``)."""
    from transformers import AutoConfig

    model = config.worker.actor.model
    hf_config = AutoConfig.from_pretrained(model.model_path, trust_remote_code=model.trust_remote_code).to_dict()
    return {"world_size": config.world_size, "optimizer": OPTIMIZER, "actor_lora_rank": model.lora.rank,
            "critic": config.algorithm.needs_critic, "model": model_fingerprint(hf_config)}


def write_manifest(folder: str, identity: dict[str, Any]) -> None:
    """Write ``<folder>/manifest.json``: ``identity`` and the size of every file written so far (call it last)."""
    sizes = {os.path.relpath(os.path.join(root, name), folder): os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(folder) for name in names}
    sizes.pop(MANIFEST, None)
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({**identity, "files": dict(sorted(sizes.items()))}, f, indent=1)


def mismatches(saved: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """One phrase per difference between the manifest ``saved`` and ``expected`` (``run_identity``); keys missing on
    either side are not compared."""
    found = []
    for key, label in _SETTINGS.items():
        if key in saved and key in expected and saved[key] != expected[key]:
            found.append(f"saved with {label} = {saved[key]}, this run has {expected[key]}")
    model_saved, model_now = saved.get("model", {}), expected.get("model", {})
    for key in MODEL_KEYS:
        if key in model_saved and key in model_now and model_saved[key] != model_now[key]:
            found.append(f"saved from a model with {key}={model_saved[key]}, this run's model "
                         f"(worker.actor.model.model_path) has {key}={model_now[key]}")
    return found


def check_checkpoint(folder: str, identity: dict[str, Any]) -> None:
    """Refuse checkpoint ``folder`` with a missing or truncated file, or written by a run that does not fit
    ``identity`` (:func:`run_identity`): ``RunStateError`` naming the files or the mismatch."""
    path = os.path.join(folder, MANIFEST)
    saved: dict[str, Any] = {}
    if not os.path.isfile(path):  # written without a manifest: the files every rank reads, sizes unknown
        ranks = range(identity.get("world_size", 1))
        needed = [os.path.join("actor", ".metadata"), "trainer_state.pt", *(f"extra_state_rank_{r}.pt" for r in ranks)]
        if identity.get("critic"):
            needed += [os.path.join("critic", ".metadata"),
                       *(os.path.join("critic", f"extra_state_rank_{r}.pt") for r in ranks)]
        files = dict.fromkeys(needed)
    else:
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RunStateError(f"{path} is not valid JSON ({err}): the checkpoint {folder} is damaged. Resume from "
                                "another one (trainer.load_checkpoint_path=<folder>/global_step_M).") from None
        files = saved.get("files", {})
    damaged = []
    for rel, size in files.items():
        file = os.path.join(folder, rel)
        if not os.path.isfile(file):
            damaged.append(f"{file} is missing")
        elif size is not None and os.path.getsize(file) != size:
            damaged.append(f"{file} holds {os.path.getsize(file)} of its {size} bytes")
    if damaged:
        raise RunStateError(f"checkpoint {folder} is incomplete: {'; '.join(damaged)}. Restore the files, or resume "
                            "from an earlier checkpoint (trainer.load_checkpoint_path=<folder>/global_step_M).")
    different = mismatches(saved, identity)
    if different:
        raise RunStateError(
            f"checkpoint {folder} ({path}) does not fit this run: {'; '.join(different)}. Resume it with the settings "
            "it was saved with, or start a new run: another trainer.experiment_name (or trainer.save_checkpoint_path)."
        )
