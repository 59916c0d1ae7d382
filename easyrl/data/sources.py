"""Loading a ``data_path`` into a ``datasets.Dataset``: a hub dataset ``name@split``, a local
``.parquet``/``.json``/``.jsonl`` file or folder (``path@split`` picks a split), or a raw InterGPS Geometry3K folder."""

from __future__ import annotations

import logging
import os
from typing import Any

import datasets

from easyrl.data.checks import NO_ROWS_HINT, data_files_under, read_error
from easyrl.data.intergps import intergps_problem_dirs, load_intergps_geometry3k
from easyrl.errors import DataError

logger = logging.getLogger("easyrl.data")

LOCAL_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


def _pick_split(splits: dict[str, datasets.Dataset], split: str | None, source: str) -> datasets.Dataset:
    """The requested split; without one, the only split or else ``train``."""
    if split is None:
        if len(splits) == 1:
            return next(iter(splits.values()))
        if "train" in splits:
            logger.info("%s has splits %s; using 'train' (write %s@SPLIT for another)", source, sorted(splits), source)
            return splits["train"]
        raise DataError(f"{source!r} has splits {sorted(splits)}; pick one by writing {source}@SPLIT")
    if split not in splits:
        raise DataError(f"{source!r} has no split {split!r}; its splits are {sorted(splits)}")
    return splits[split]


def load_source(data_path: str) -> datasets.Dataset:
    """The rows of ``data_path``. DataError (naming the path, file, line or split): a missing path, an empty file or
    source, no data files, an unsupported extension, malformed JSON, unreadable parquet, an unknown split, or a hub
    dataset that cannot be loaded."""
    path, split = data_path, None
    if not os.path.exists(data_path) and "@" in data_path:
        path, split = data_path.rsplit("@", 1)
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        ext = os.path.splitext(path)[1].lower()
        if ext not in LOCAL_FILE_BUILDERS:
            raise DataError(
                f"data file {path!r} has an unsupported extension; use one of {sorted(LOCAL_FILE_BUILDERS)}"
            )
        return _not_empty(load_split(LOCAL_FILE_BUILDERS[ext], data_path, split, data_files=path), data_path)
    if os.path.isdir(path):
        if intergps_problem_dirs(path):
            return _not_empty(_pick_split(load_intergps_geometry3k(path), split, path), data_path)
        return _not_empty(load_split(path, data_path, split), data_path)
    looks_local = path.startswith((os.sep, ".", "~")) or os.path.splitext(path)[1].lower() in LOCAL_FILE_BUILDERS
    if split is None or looks_local:
        raise DataError(
            f"data path {data_path!r} does not exist; give a local .parquet/.json/.jsonl file or folder, or a hub "
            "dataset as NAME@SPLIT (e.g. hiyouga/geometry3k@train)"
        )
    try:
        return datasets.load_dataset(path, split=split)
    except Exception as err:  # network, auth, unknown dataset or split: all surface as one clear message
        raise DataError(
            f"cannot load hub dataset {path!r} split {split!r} (from data path {data_path!r}): "
            f"{type(err).__name__}: {err}. Without network access, preprocess the data to a local parquet file "
            "(e.g. examples/data_preprocess/geo3k.py) and point the data path at it."
        ) from err


def load_split(builder: str, source: str, split: str | None, **kwargs: Any) -> datasets.Dataset:
    """``datasets.load_dataset(builder, **kwargs)`` reduced to one split; DataError for no data files, an empty file
    or one ``datasets`` cannot read."""
    files = data_files_under(kwargs.get("data_files") or builder)
    if not files:
        raise DataError(f"no .parquet/.json/.jsonl data files found in {source!r}")
    for file in files:
        if os.path.getsize(file) == 0:
            raise DataError(f"data file {file!r} is empty; fill it or point the data path elsewhere")
    try:
        loaded = datasets.load_dataset(builder, **kwargs)
    except (datasets.exceptions.DataFilesNotFoundError, datasets.data_files.EmptyDatasetError) as err:
        raise DataError(f"no .parquet/.json/.jsonl data files found in {source!r}: {err}") from err
    except Exception as err:  # malformed JSON, corrupt parquet, ...: name the file and line
        raise read_error(source, files, err) from err
    return _pick_split(dict(loaded), split, source)


def _not_empty(dataset: datasets.Dataset, source: str) -> datasets.Dataset:
    if len(dataset) == 0:
        raise DataError(f"data {source!r} holds no rows{NO_ROWS_HINT}")
    return dataset
