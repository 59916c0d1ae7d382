"""Data pipeline: prompt sources, images, videos, format templates and the RL prompt dataset. Names are imported on
first use, so that ``easyrl.data.images`` imports without ``datasets``."""

import importlib

_MODULES = {"RLDataset": "dataset", "collate_fn": "dataset", "process_image": "images", "target_size": "images",
            "load_intergps_geometry3k": "intergps", "load_format_prompt": "prompts", "load_source": "sources"}
__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'easyrl.data' has no attribute '{name}'")
    return getattr(importlib.import_module(f"easyrl.data.{_MODULES[name]}"), name)
