"""Geometry3K in the raw InterGPS layout (Lu et al., "Inter-GPS", ACL 2021) -> the columns of the hub copy
``hiyouga/geometry3k`` (:data:`GEO3K_FEATURES`)."""

from __future__ import annotations

import json
import os
from typing import Any

import datasets

from easyrl.errors import DataError

IMAGE_PLACEHOLDER = "<image>"

GEO3K_CHOICE_LETTERS = "ABCD"
INTERGPS_SPLIT_NAMES = {"train": "train", "val": "validation", "validation": "validation", "test": "test"}
GEO3K_FEATURES = datasets.Features(
    {
        "images": datasets.Sequence(datasets.Image()),
        "problem": datasets.Value("string"),
        "answer": datasets.Value("string"),
        "id": datasets.Value("int64"),
        "choices": datasets.Sequence(datasets.Value("string")),
        "ground_truth": datasets.Value("string"),
    }
)


def intergps_problem_dirs(root: str) -> list[str]:
    """Folders under ``root`` (depth 1 or 2) that hold a Geometry3K problem (``data.json``), sorted by problem id."""
    found = []
    for name in os.listdir(root):
        sub = os.path.join(root, name)
        if not os.path.isdir(sub):
            continue
        if os.path.isfile(os.path.join(sub, "data.json")):
            found.append(sub)
        else:  # the full dump has train/ val/ test/ folders of problems
            found.extend(
                os.path.join(sub, inner)
                for inner in os.listdir(sub)
                if os.path.isfile(os.path.join(sub, inner, "data.json"))
            )
    return sorted(found, key=lambda p: (int(os.path.basename(p)), p) if os.path.basename(p).isdigit() else (1 << 62, p))


def convert_intergps_problem(problem_dir: str) -> tuple[str, dict[str, Any]]:
    """One problem folder -> ``(split, row)``: ``images`` [the diagram], ``problem`` ``"<image>" + problem_text``,
    ``answer`` the correct choice's text, ``id``, ``choices``, ``ground_truth`` its letter; ``split`` from
    ``data_type`` ("val" -> "validation"). DataError for a missing file or a malformed ``data.json`` (naming it)."""
    json_path = os.path.join(problem_dir, "data.json")
    image_path = os.path.join(problem_dir, "img_diagram.png")
    for path in (json_path, image_path):
        if not os.path.isfile(path):
            raise DataError(f"Geometry3K problem folder {problem_dir!r} lacks {os.path.basename(path)}")
    with open(json_path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise DataError(f"{json_path}: not valid JSON ({err})") from err
    missing = [k for k in ("problem_text", "choices", "answer", "id") if k not in data]
    if missing:
        raise DataError(f"{json_path}: missing field(s) {missing}")
    choices = [str(c) for c in data["choices"]]
    letter = str(data["answer"]).strip()
    index = GEO3K_CHOICE_LETTERS.find(letter) if len(letter) == 1 else -1
    if not 0 <= index < len(choices):
        raise DataError(f"{json_path}: answer {letter!r} is not a letter A-D naming one of the {len(choices)} choices")
    split_raw = str(data.get("data_type", "train"))
    split = INTERGPS_SPLIT_NAMES.get(split_raw, split_raw)
    with open(image_path, "rb") as f:
        image_bytes = f.read()
    row = {
        "images": [{"bytes": image_bytes, "path": f"{os.path.basename(problem_dir)}/img_diagram.png"}],
        "problem": IMAGE_PLACEHOLDER + str(data["problem_text"]),
        "answer": choices[index],
        "id": int(data["id"]),
        "choices": choices,
        "ground_truth": letter,
    }
    return split, row


def load_intergps_geometry3k(root: str) -> dict[str, datasets.Dataset]:
    """One ``datasets.Dataset`` per split of the problems under ``root``; FileNotFoundError without any."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Geometry3K folder {root!r} does not exist")
    problem_dirs = intergps_problem_dirs(root)
    if not problem_dirs:
        raise FileNotFoundError(f"{root!r} holds no InterGPS problem folders (<id>/data.json + <id>/img_diagram.png)")
    by_split: dict[str, list[dict]] = {}
    for problem_dir in problem_dirs:
        split, row = convert_intergps_problem(problem_dir)
        by_split.setdefault(split, []).append(row)
    return {split: datasets.Dataset.from_list(rows, features=GEO3K_FEATURES) for split, rows in by_split.items()}
