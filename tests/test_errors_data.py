"""docs/errors.md, data entries (D.., W..): ``data.*`` checked when the datasets are built, before Ray, each ending in
one ``easyrl: data error: ...`` (or ``config error``) line naming the config key, the file and the row or column, exit
status 2, no traceback. One tokenizer and processor (the tiny Qwen2.5-VL's) serve the whole module."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import datasets
import huggingface_hub.constants
import numpy as np
import pytest
from PIL import Image

from easyrl.config import load_config
from easyrl.trainer.preflight import check_enough_prompts, load_dataset_for

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "data" / "geometry3k_sample"
GOOD_IMAGE = str(SAMPLE / "11" / "img_diagram.png")


@pytest.fixture(scope="module")
def vl(tiny_model_path):
    from transformers import AutoProcessor, AutoTokenizer

    path = tiny_model_path("qwen2_5_vl")
    return AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)


def _config(*overrides: str):
    return load_config([f"config={REPO / 'examples/configs/cpu_demo.yaml'}", "worker.actor.model.model_path=m",
                        "data.format_prompt=null", *overrides])


def _load(vl, path, *overrides: str, key: str = "data.train_files", text_only: bool = False):
    tokenizer, processor = vl
    config = _config(*overrides)
    return lambda: load_dataset_for(key, str(path), config, tokenizer, None if text_only else processor)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _truncated_png(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])  # the header is intact, the pixels are not
    return path


ROW = {"problem": "<image>Find x.", "answer": "3", "images": [GOOD_IMAGE]}


def test_train_files_that_do_not_exist(expect_user_error, vl):  # D01
    expect_user_error(_load(vl, "./no/such/train.jsonl"), "data", "data.train_files: data path './no/such/train.jsonl'",
                      "does not exist")


def test_val_files_that_do_not_exist(expect_user_error, vl):  # D02
    expect_user_error(_load(vl, "/no/such/val", key="data.val_files"), "data",
                      "data.val_files: data path '/no/such/val'",
                      "does not exist")


def test_empty_file(expect_user_error, vl, tmp_path):  # D03
    (tmp_path / "train.jsonl").write_text("")
    expect_user_error(_load(vl, tmp_path / "train.jsonl"), "data", "data.train_files: data file", "train.jsonl",
                      "is empty")


def test_empty_folder(expect_user_error, vl, tmp_path):  # D04
    expect_user_error(_load(vl, tmp_path), "data", "data.train_files: no .parquet/.json/.jsonl", str(tmp_path))


def test_file_without_rows(expect_user_error, vl, tmp_path):  # D05
    (tmp_path / "train.jsonl").write_text("\n\n")
    expect_user_error(_load(vl, tmp_path / "train.jsonl"), "data", "train.jsonl", "holds no rows",
                      "write one row per sample", '{"problem": "What is 2+2?", "answer": "4"}')


def test_malformed_json_line_names_file_and_line(expect_user_error, vl, tmp_path):  # D06
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n{"problem": "c", "answer": "3"}\n')
    expect_user_error(_load(vl, path), "data", f"{path} line 2", "not valid JSON")


def test_malformed_json_document_names_file_and_line(expect_user_error, vl, tmp_path):  # D07
    path = tmp_path / "train.json"
    path.write_text('[{"problem": "a", "answer": "1"},\n {"problem": "b" "answer": "2"}]\n')
    expect_user_error(_load(vl, path), "data", f"{path} line 2", "not valid JSON")


def test_malformed_json_line_inside_a_folder(expect_user_error, vl, tmp_path):  # D08
    _jsonl(tmp_path / "train.jsonl", [{"problem": "a", "answer": "1"}])
    (tmp_path / "train-2.jsonl").write_text('{"problem": "b", "answer": "2"}\nnot json\n')
    expect_user_error(_load(vl, tmp_path), "data", "train-2.jsonl line 2", "not valid JSON")


def test_unsupported_extension(expect_user_error, vl, tmp_path):  # D09
    (tmp_path / "train.csv").write_text("problem,answer\na,1\n")
    expect_user_error(_load(vl, tmp_path / "train.csv"), "data", "train.csv", "unsupported extension")


def test_corrupt_parquet(expect_user_error, vl, tmp_path):  # D10
    (tmp_path / "train.parquet").write_bytes(b"not a parquet file at all")
    expect_user_error(_load(vl, tmp_path / "train.parquet"), "data", "train.parquet", "not a readable parquet file")


def test_missing_prompt_column(expect_user_error, vl, tmp_path):  # D11
    path = _jsonl(tmp_path / "train.jsonl", [{"question": "a", "answer": "1"}])
    expect_user_error(_load(vl, path), "data", "column 'problem'", "data.prompt_key", "['question', 'answer']")


def test_missing_answer_column(expect_user_error, vl, tmp_path):  # D12
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "a", "solution": "1"}])
    expect_user_error(_load(vl, path), "data", "column 'answer'", "data.answer_key")


def test_row_with_null_answer(expect_user_error, vl, tmp_path):  # D13
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": None}])
    expect_user_error(_load(vl, path), "data", "row 1 of", "train.jsonl", "column 'answer' (data.answer_key) is empty",
                      "write the reference answer the reward compares against", "or remove the row")


def test_row_with_blank_answer(expect_user_error, vl, tmp_path):  # D14
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "a", "answer": "  "}, {"problem": "b", "answer": "2"}])
    expect_user_error(_load(vl, path), "data", "row 0 of", "column 'answer' (data.answer_key) is empty",
                      "write the reference answer the reward compares against", "or remove the row")


def test_truncated_png_file_names_the_row(expect_user_error, vl, tmp_path):  # D15
    bad = _truncated_png(tmp_path / "truncated.png")
    path = _jsonl(tmp_path / "train.jsonl", [ROW, {**ROW, "images": [str(bad)]}])
    expect_user_error(_load(vl, path), "data", "row 1 of", "truncated.png", "cannot read")


def test_truncated_png_inside_parquet_names_the_row(expect_user_error, vl, tmp_path):  # D16
    bad = _truncated_png(tmp_path / "truncated.png").read_bytes()
    good = Path(GOOD_IMAGE).read_bytes()
    rows = [{"problem": "<image>a", "answer": "1", "images": [{"bytes": b, "path": None}]} for b in (good, good, bad)]
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.Sequence(datasets.Image())})
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(tmp_path / "train.parquet"))
    expect_user_error(_load(vl, tmp_path / "train.parquet"), "data", "row 2 of", "train.parquet", "image bytes")


def test_missing_image_file(expect_user_error, vl, tmp_path):  # D17
    path = _jsonl(tmp_path / "train.jsonl", [{**ROW, "images": ["gone.png"]}])
    expect_user_error(_load(vl, path, f"data.image_dir={tmp_path}"), "data", "row 0 of", "gone.png")


def test_placeholders_do_not_match_images(expect_user_error, vl, tmp_path):  # D18
    path = _jsonl(tmp_path / "train.jsonl", [ROW, {**ROW, "problem": "<image> and <image>?"}])
    expect_user_error(_load(vl, path), "data", "row 1 of", "2 <image> placeholders but 1 images", "data.image_key")


def test_placeholder_without_an_image_column(expect_user_error, vl, tmp_path):  # D19
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "<image>Find x.", "answer": "1"}])
    expect_user_error(_load(vl, path), "data", "row 0 of", "no image column 'images'", "data.image_key")


def test_wrong_image_key_beside_an_image_column(expect_user_error, vl, tmp_path):  # D20
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "Find x.", "answer": "1", "images": [GOOD_IMAGE]}])
    expect_user_error(_load(vl, path, "data.image_key=pictures"), "data", "data.image_key='pictures'",
                      "column 'images' looks like images", "data.image_key=images")


def test_prompt_that_is_not_a_string(expect_user_error, vl, tmp_path):  # D21
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": ["a", "list"], "answer": "1"}])
    expect_user_error(_load(vl, path), "data", "row 0 of", "column 'problem' holds a list",
                      "write the prompt's text as one string in that column", "or set data.prompt_key")


def test_every_prompt_too_long(expect_user_error, vl, tmp_path):  # D22
    path = _jsonl(tmp_path / "train.jsonl", [{"problem": "word " * 400, "answer": "1"}])
    expect_user_error(_load(vl, path), "data", "all 1 prompts", "max_prompt_length=256", "data.max_prompt_length")


def test_fewer_prompts_than_one_rollout_batch(expect_user_error):  # D23
    config = _config("data.train_files=small.jsonl")
    expect_user_error(lambda: check_enough_prompts(config, 3), "data", "data.train_files='small.jsonl' has 3 prompts",
                      "data.rollout_batch_size=4")


def test_split_the_folder_does_not_have(expect_user_error, vl, tmp_path):  # D24
    _jsonl(tmp_path / "train.jsonl", [{"problem": "a", "answer": "1"}])
    expect_user_error(_load(vl, f"{tmp_path}@test"), "data", "data.train_files:",
                      f"'{tmp_path}@test' has no split 'test'",
                      "'train'")


def test_hub_dataset_that_cannot_be_loaded(expect_user_error, vl, monkeypatch):  # D25
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    expect_user_error(_load(vl, "easyrl-tests/no-such-data@train"), "data",
                      "data.train_files: cannot load hub dataset 'easyrl-tests/no-such-data' split 'train'")


def test_format_prompt_file_missing(expect_user_error, vl):  # D26
    expect_user_error(_load(vl, SAMPLE, "data.format_prompt=./no/such.jinja"), "config", "no/such.jinja",
                      "data.format_prompt")


def test_format_prompt_with_a_syntax_error(expect_user_error, vl, tmp_path):  # D27
    (tmp_path / "bad.jinja").write_text("{{ content }\n")
    expect_user_error(_load(vl, SAMPLE, f"data.format_prompt={tmp_path / 'bad.jinja'}"), "config", "bad.jinja",
                      "(data.format_prompt) line 1")


def test_pixel_bounds_outside_the_processor(expect_user_error, vl):  # D28
    expect_user_error(_load(vl, SAMPLE, "data.min_pixels=2000000", "data.max_pixels=3000000"), "config",
                      "data.min_pixels/max_pixels [2000000, 3000000]", "image processor")


def test_text_only_model_with_image_data_warns_naming_the_column(vl, caplog):  # W01
    with caplog.at_level(logging.WARNING, logger="easyrl.data"):
        dataset = _load(vl, SAMPLE, text_only=True)()
    assert len(dataset) == 10 and dataset[0]["images"] == []
    assert "column 'images' (data.image_key) holds images but the model is text-only" in caplog.text
    assert "data.image_key=null" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="easyrl.data"):
        _load(vl, SAMPLE, "data.image_key=null", text_only=True)()
    assert "text-only" not in caplog.text


def test_more_images_in_a_row_than_the_engine_takes(expect_user_error, vl, tmp_path):  # D35
    """vLLM refuses a prompt with more images than ``worker.rollout.limit_images`` (was: after Ray, at the first
    rollout); the row is named, and a limit that fits passes."""
    two = {**ROW, "problem": "<image> and <image>: find x.", "images": [GOOD_IMAGE, GOOD_IMAGE]}
    path = _jsonl(tmp_path / "train.jsonl", [ROW, two])
    expect_user_error(_load(vl, path, "worker.rollout.limit_images=1"), "data", "data.train_files", "row 1 of",
                      "2 images", "worker.rollout.limit_images=1", "worker.rollout.limit_images=2")
    assert _load(vl, path, "worker.rollout.limit_images=2")().max_images == 2
