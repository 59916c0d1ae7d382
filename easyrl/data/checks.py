"""Why a data source cannot be read, in the user's terms (file, line, column): after ``datasets`` fails, find the file
and line behind its message and raise a :class:`easyrl.errors.DataError`."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import datasets

from easyrl.errors import DataError

logger = logging.getLogger("easyrl.data")

JSON_EXTENSIONS = (".json", ".jsonl")
DATA_EXTENSIONS = (".parquet",) + JSON_EXTENSIONS
IMAGE_COLUMN_NAMES = ("images", "image", "imgs", "img", "pictures", "pics", "figures")


def data_files_under(path: str) -> list[str]:
    """``path`` itself if it is a file, else every ``.parquet/.json/.jsonl`` file below the folder, sorted."""
    if os.path.isfile(path):
        return [path]
    found = []
    for root, _, names in os.walk(path):
        found += [os.path.join(root, n) for n in names if os.path.splitext(n)[1].lower() in DATA_EXTENSIONS]
    return sorted(found)


def bad_json_line(path: str) -> tuple[int, str] | None:
    """``(line number, reason)`` of the first bad line of a JSON (one document, parsed whole) or JSON-lines file
    (one object per non-blank line), else None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    document_error = None
    if path.lower().endswith(".json"):
        try:
            json.loads(text)
            return None
        except json.JSONDecodeError as err:
            document_error = (err.lineno, f"{err.msg} at column {err.colno}")
        first_line = next((line for line in text.splitlines() if line.strip()), "")
        if text.lstrip().startswith("[") or not _parses(first_line):
            return document_error  # one document over several lines, not JSON lines
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            return number, f"{err.msg} at column {err.colno}"
        if not isinstance(value, dict):
            return number, f"a JSON {type(value).__name__}, not an object (one row per line)"
    return None


def _has_text(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.strip() for line in f)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


NO_ROWS_HINT = ("; write one row per sample (JSON lines: one object per line, e.g. "
                '{"problem": "What is 2+2?", "answer": "4"}, with the columns data.prompt_key and data.answer_key '
                "name), or point the key at a file that has rows")


def read_error(source: str, files: list[str], err: BaseException) -> DataError:
    """The ``DataError`` for ``datasets`` failing on ``source``: the bad JSON line or parquet file among ``files``,
    else the library's reason in one line."""
    for file in files:
        if file.lower().endswith(JSON_EXTENSIONS):
            bad = bad_json_line(file)
            if bad is not None:
                return DataError(f"{file} line {bad[0]}: not valid JSON ({bad[1]}); fix or remove that line")
        elif file.lower().endswith(".parquet"):
            import pyarrow.parquet

            try:
                pyarrow.parquet.read_metadata(file)
            except Exception as parquet_err:
                return DataError(f"data file {file!r} is not a readable parquet file ({parquet_err})")
    if all(f.lower().endswith(JSON_EXTENSIONS) and not _has_text(f) for f in files):
        return DataError(f"data {source!r} holds no rows{NO_ROWS_HINT}")
    cause = err.__cause__ or err
    reason = (str(cause).strip().splitlines() or [""])[0]
    return DataError(f"cannot read data {source!r}: {type(cause).__name__}: {reason}")


def check_columns(dataset: datasets.Dataset, source: str, prompt_key: str, answer_key: str) -> None:
    """DataError unless the prompt and answer columns exist (naming the column, source, columns and config key)."""
    columns = dataset.column_names
    for key, config_key in ((prompt_key, "data.prompt_key"), (answer_key, "data.answer_key")):
        if key not in columns:
            raise DataError(f"column {key!r} not found in {source!r}; available columns: {columns}. "
                            f"Set {config_key} to the column that holds it.")


def check_image_column(dataset: datasets.Dataset, image_key: str | None, prompt_key: str, source: str,
                       text_only: bool) -> None:
    """DataError when ``image_key`` is not a column but another column looks like images (an ``Image`` feature or a
    list of them, or a usual image column name; naming both); a warning when a text-only model gets images (they are
    dropped)."""
    columns = dataset.column_names
    candidates = [name for name, feature in dataset.features.items() if name != prompt_key and (
        isinstance(feature, datasets.Image) or isinstance(getattr(feature, "feature", None), datasets.Image)
        or (isinstance(feature, list) and feature and isinstance(feature[0], datasets.Image))
        or name.lower() in IMAGE_COLUMN_NAMES)]
    if image_key is not None and image_key not in columns and candidates:
        raise DataError(
            f"data.image_key={image_key!r} is not a column of {source!r}, but column {candidates[0]!r} looks like "
            f"images; set data.image_key={candidates[0]} (or data.image_key=null to train on the text alone)"
        )
    if text_only and image_key is not None and image_key in columns:
        logger.warning(
            "%s: column %r (data.image_key) holds images but the model is text-only (it has no vision_config): "
            "the images are dropped and <image> placeholders removed. Use a vision-language model, or set "
            "data.image_key=null to silence this warning", source, image_key,
        )


def is_missing_answer(value: Any) -> bool:
    """Whether a row's answer is absent: None, or a string with nothing but whitespace."""
    return value is None or (isinstance(value, str) and not value.strip())
