"""Geometry3K InterGPS -> hub columns conversion (easyrl.data.dataset) and examples/data_preprocess/geo3k.py."""

import importlib.util
import json
import shutil
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
from PIL import Image

from easyrl.data.intergps import convert_intergps_problem, load_intergps_geometry3k
from easyrl.errors import DataError

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "data_preprocess" / "geo3k.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("geo3k_preprocess_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_problem_11_answer_letter_becomes_choice_text(geo3k_sample_dir):
    split, row = convert_intergps_problem(str(Path(geo3k_sample_dir) / "11"))
    # data.json of problem 11: answer "D", choices ["30", "40", "60", "80"]
    assert split == "train"
    assert row["answer"] == "80" and row["ground_truth"] == "D" and row["id"] == 11
    assert row["choices"] == ["30", "40", "60", "80"]
    assert row["problem"] == "<image>In \\odot X, A B = 30, C D = 30, and m \\widehat C Z = 40. Find m \\widehat A B."
    assert row["images"][0]["bytes"] == (Path(geo3k_sample_dir) / "11" / "img_diagram.png").read_bytes()


def test_whole_sample_matches_an_independent_reading(geo3k_sample_dir):
    splits = load_intergps_geometry3k(str(geo3k_sample_dir))
    assert list(splits) == ["train"]
    rows = splits["train"]
    expected = {}
    for data_json in Path(geo3k_sample_dir).glob("*/data.json"):
        data = json.loads(data_json.read_text())
        expected[data["id"]] = (data["choices"]["ABCD".index(data["answer"])], data["problem_text"], data["img_width"])
    assert sorted(rows["id"]) == sorted(expected) and rows["id"] == sorted(rows["id"])
    for row in rows:
        answer, text, width = expected[row["id"]]
        assert row["answer"] == answer and row["problem"] == "<image>" + text
        assert isinstance(row["images"][0], Image.Image) and row["images"][0].width == width
    assert rows[4]["answer"] == "5 \\sqrt { 3 }"  # problem 15: answer "C"


def test_splits_follow_data_type_and_bad_answers_name_the_file(geo3k_sample_dir, tmp_path):
    root = tmp_path / "intergps"
    for problem_id, data_type in (("11", "train"), ("12", "val"), ("13", "test"), ("14", "test")):
        shutil.copytree(Path(geo3k_sample_dir) / problem_id, root / problem_id)
        data = json.loads((root / problem_id / "data.json").read_text())
        (root / problem_id / "data.json").write_text(json.dumps(dict(data, data_type=data_type)))
    splits = load_intergps_geometry3k(str(root))
    assert {k: v["id"] for k, v in splits.items()} == {"train": [11], "validation": [12], "test": [13, 14]}

    data = json.loads((root / "13" / "data.json").read_text())
    (root / "13" / "data.json").write_text(json.dumps(dict(data, answer="E")))
    with pytest.raises(ValueError, match=r"13/data.json: answer 'E'"):
        load_intergps_geometry3k(str(root))
    (root / "12" / "img_diagram.png").unlink()
    with pytest.raises(DataError, match="img_diagram.png"):
        load_intergps_geometry3k(str(root))


def test_cli_writes_parquet_that_reads_back_with_images(geo3k_sample_dir, tmp_path):
    out = tmp_path / "geo3k"
    written = _load_script().main(["--local_dir", str(out), "--intergps_dir", str(geo3k_sample_dir)])
    assert written == {"train": str(out / "train.parquet")}
    loaded = datasets.load_dataset("parquet", data_files=written["train"], split="train")
    assert loaded.column_names == ["images", "problem", "answer", "id", "choices", "ground_truth"]
    assert isinstance(loaded.features["images"].feature, datasets.Image)
    first = loaded[0]
    original = Image.open(Path(geo3k_sample_dir) / str(first["id"]) / "img_diagram.png")
    assert first["images"][0].size == original.size
    assert first["images"][0].tobytes() == original.tobytes()


def test_cli_hub_failure_is_clear(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit, match=r"cannot load 'someone/geometry3k'.*--intergps_dir"):
        _load_script().main(["--local_dir", str(tmp_path), "--source", "someone/geometry3k"])
