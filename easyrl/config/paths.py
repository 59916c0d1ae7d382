"""Relative input paths of a config file, looked up against the file's folder, the current folder, then the file's
parent folders, nearest first; the first place where one exists wins (docs/config.md, "Relative paths")."""

from __future__ import annotations

import os
from typing import Any, Optional

from easyrl.config.aliases import get_key, set_key

# keys whose value names an input file or folder (or a list of them); the reward function's and the tools' are
# ``path.py:function``
INPUT_PATHS: tuple[str, ...] = (
    "data.train_files", "data.val_files", "data.image_dir", "data.format_prompt",
    "worker.actor.model.model_path", "worker.actor.model.tokenizer_path",
    "worker.critic.model.model_path", "worker.critic.model.tokenizer_path",
    "worker.reward.reward_function", "trainer.load_checkpoint_path",
    "worker.reward.judge.model_path", "worker.reward.judge.prompt_template", "worker.reward.judge.parser",
    "worker.reward.reward_model.model_path", "worker.reward.reward_model.tokenizer_path",
    "worker.reward.reward_model.chat_template", "worker.rollout.multi_turn.tools",
    "worker.rollout.multi_turn.format", "worker.rollout.multi_turn.environment",
)


def search_folders(config_file: str, cwd: Optional[str] = None) -> list[str]:
    """Where a relative path of ``config_file`` is looked up, in order (see the module docstring)."""
    here = os.path.dirname(os.path.abspath(config_file))
    folders = [here, os.path.abspath(cwd or os.getcwd())]
    parent = os.path.dirname(here)
    while parent != here:
        folders.append(parent)
        here, parent = parent, os.path.dirname(parent)
    return list(dict.fromkeys(folders))


def resolve_path(value: str, folders: list[str]) -> str:
    """``value`` as an absolute path under the first of ``folders`` where it exists; unchanged when it is absolute,
    starts with ``~``, or exists nowhere. A ``file.py:function`` value is resolved by its file part."""
    path, suffix = value, ""
    if ".py:" in value:  # worker.reward.reward_function: path.py:function
        path, function = value.rsplit(":", 1)
        suffix = ":" + function
    if os.path.isabs(path) or path.startswith("~") or not path:
        return value
    for folder in folders:
        candidate = os.path.join(folder, path)
        if os.path.exists(candidate):
            return os.path.normpath(candidate) + suffix
    return value


def resolve_config_paths(layer: dict[str, Any], config_file: str, cwd: Optional[str] = None) -> dict[str, Any]:
    """Resolve the relative input paths (``INPUT_PATHS``) of the YAML layer ``layer`` read from ``config_file``, in
    place (each item of a list, e.g. ``multi_turn.tools``); returns ``layer``."""
    folders = search_folders(config_file, cwd)
    for key in INPUT_PATHS:
        value = get_key(layer, key)
        if isinstance(value, str):
            set_key(layer, key, resolve_path(value, folders))
        elif isinstance(value, list):
            set_key(layer, key, [resolve_path(item, folders) if isinstance(item, str) else item for item in value])
    return layer
