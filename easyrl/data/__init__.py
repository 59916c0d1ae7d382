"""Data pipeline: prompt sources, image resizing, format templates and the RL prompt dataset."""

from easyrl.data.dataset import RLDataset, collate_fn
from easyrl.data.images import process_image, target_size
from easyrl.data.intergps import load_intergps_geometry3k
from easyrl.data.prompts import load_format_prompt
from easyrl.data.sources import load_source

__all__ = [
    "RLDataset",
    "collate_fn",
    "load_format_prompt",
    "load_intergps_geometry3k",
    "load_source",
    "process_image",
    "target_size",
]
