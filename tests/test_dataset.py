"""easyrl.data.dataset.RLDataset / collate_fn and easyrl.data.prompts, on the Geometry3K sample and tiny Qwen models."""

import json
import logging
import pickle
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
from PIL import Image
from transformers import AutoProcessor, AutoTokenizer

from easyrl.data.dataset import RLDataset, collate_fn
from easyrl.data.intergps import load_intergps_geometry3k
from easyrl.data.prompts import load_format_prompt
from easyrl.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]
MATH_TEMPLATE = str(REPO / "examples" / "format_prompt" / "math.jinja")
PIXELS = {"min_pixels": 3136, "max_pixels": 200704}  # inside the tiny processor's [3136, 1003520]
IMAGE_PAD = "<|image_pad|>"


@pytest.fixture(scope="module")
def vl(tiny_model_path):
    path = tiny_model_path("qwen2_5_vl")
    return AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def text_tokenizer(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path("qwen2_5"))


@pytest.fixture(scope="module")
def geo3k_parquet(geo3k_sample_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("geo3k") / "train.parquet"
    load_intergps_geometry3k(str(geo3k_sample_dir))["train"].to_parquet(str(path))
    return str(path)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_vl_prompt_ids_count_text_plus_image_tokens(vl, geo3k_parquet, geo3k_sample_dir):
    tokenizer, processor = vl
    dataset = RLDataset(geo3k_parquet, tokenizer, processor, format_prompt=MATH_TEMPLATE, **PIXELS)
    assert len(dataset) == 10
    pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    for index in range(len(dataset)):
        item = dataset[index]
        (image,) = item["images"]
        grid = item["multi_modal_inputs"]["image_grid_thw"]
        n_image_tokens = int(grid.prod()) // 4  # 2 x 2 patches merge into one token
        assert image.mode == "RGB" and image.width % 28 == 0 and image.height % 28 == 0
        assert PIXELS["min_pixels"] <= image.width * image.height <= PIXELS["max_pixels"]
        assert grid.tolist() == [[1, image.height // 14, image.width // 14]]  # the processor did not resize again
        assert item["multi_modal_inputs"]["pixel_values"].shape[0] == int(grid.prod())
        assert item["raw_prompt_ids"].count(pad_id) == 1
        n_text_tokens = len(item["raw_prompt_ids"]) - 1
        assert len(item["prompt_ids"]) == n_text_tokens + n_image_tokens
        assert item["prompt_ids"].count(pad_id) == n_image_tokens
        assert [t for t in item["prompt_ids"] if t != pad_id] == [t for t in item["raw_prompt_ids"] if t != pad_id]

    item = dataset[0]  # problem 11: answer "D" of ["30", "40", "60", "80"]
    assert item["ground_truth"] == "80"
    text = tokenizer.decode(item["raw_prompt_ids"])
    problem = json.loads((Path(geo3k_sample_dir) / "11" / "data.json").read_text())["problem_text"]
    assert f"<|im_start|>user\n<|vision_start|>{IMAGE_PAD}<|vision_end|>{problem} " in text
    assert "<think> </think>" in text and "\\boxed{}" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_overlong_filter_drops_rows_and_logs_count(vl, geo3k_parquet, caplog):
    tokenizer, processor = vl
    full = RLDataset(geo3k_parquet, tokenizer, processor, filter_overlong_prompts=False, **PIXELS)
    lengths = [len(full[i]["prompt_ids"]) for i in range(len(full))]
    limit = sorted(lengths)[4]
    expected_kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert 0 < len(expected_kept) < 10
    with caplog.at_level(logging.INFO, logger="easyrl.data"):
        short = RLDataset(geo3k_parquet, tokenizer, processor, max_prompt_length=limit, **PIXELS)
    assert len(short) == len(expected_kept)
    assert [short[i]["prompt_ids"] for i in range(len(short))] == [full[i]["prompt_ids"] for i in expected_kept]
    assert f"filtered out {10 - len(expected_kept)} of 10 prompts" in caplog.text
    with pytest.raises(ValueError, match=r"all 10 prompts .* max_prompt_length=10 .*data\.max_prompt_length"):
        RLDataset(geo3k_parquet, tokenizer, processor, max_prompt_length=10, **PIXELS)


def test_text_only_model_ignores_images(text_tokenizer, geo3k_parquet):
    dataset = RLDataset(geo3k_parquet, text_tokenizer, None, format_prompt=MATH_TEMPLATE)
    item = dataset[0]
    assert item["images"] == [] and item["multi_modal_inputs"] == {}
    assert item["prompt_ids"] == item["raw_prompt_ids"]
    text = text_tokenizer.decode(item["raw_prompt_ids"])
    assert "<image>" not in text and "vision" not in text and IMAGE_PAD not in text
    assert "<|im_start|>user\nIn \\odot X, A B = 30" in text


def test_local_sources_jsonl_folder_intergps_and_image_dir(vl, geo3k_sample_dir, geo3k_parquet, tmp_path):
    tokenizer, processor = vl
    rows = [
        {"question": "What is 2+2?", "solution": "4"},
        {"question": "<image>Side of the figure?", "solution": "5", "pics": ["11/img_diagram.png"]},
        {"question": "Compare <image> and <image>.", "solution": "same",
         "pics": ["12/img_diagram.png", "13/img_diagram.png"]},
        {"question": "No placeholder here.", "solution": "x", "pics": ["14/img_diagram.png"]},
    ]  # fmt: skip
    rows[0]["pics"] = []
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    dataset = RLDataset(path, tokenizer, processor, prompt_key="question", answer_key="solution", image_key="pics",
                        image_dir=str(geo3k_sample_dir), **PIXELS)  # fmt: skip
    assert [len(dataset[i]["images"]) for i in range(4)] == [0, 1, 2, 1]
    assert dataset[0]["multi_modal_inputs"] == {} and dataset[0]["prompt_ids"] == dataset[0]["raw_prompt_ids"]
    assert dataset[2]["multi_modal_inputs"]["image_grid_thw"].shape == (2, 3)
    vision = f"<|vision_start|>{IMAGE_PAD}<|vision_end|>"
    assert f"user\nCompare {vision} and {vision}.<|im_end|>" in tokenizer.decode(dataset[2]["raw_prompt_ids"])
    assert f"user\n{vision}No placeholder here." in tokenizer.decode(dataset[3]["raw_prompt_ids"])
    assert dataset[1]["ground_truth"] == "5"

    # a folder of parquet files (as written by examples/data_preprocess/geo3k.py), with and without @split
    folder = Path(geo3k_parquet).parent
    assert len(RLDataset(str(folder), tokenizer, processor, **PIXELS)) == 10
    assert len(RLDataset(f"{folder}@train", tokenizer, processor, **PIXELS)) == 10
    with pytest.raises(ValueError, match="no split 'test'"):
        RLDataset(f"{folder}@test", tokenizer, processor, **PIXELS)
    # the raw InterGPS folder, converted on the fly
    intergps = RLDataset(str(geo3k_sample_dir), tokenizer, processor, **PIXELS)
    assert [intergps[i]["ground_truth"] for i in range(3)] == ["80", "13", "9"]  # problems 11, 12, 13: D, B, A


def test_missing_columns_name_column_file_and_config_key(vl, geo3k_parquet, tmp_path):
    tokenizer, processor = vl
    with pytest.raises(DataError, match=r"'question'.*train\.parquet.*'problem'.*data\.prompt_key"):
        RLDataset(geo3k_parquet, tokenizer, processor, prompt_key="question")
    with pytest.raises(DataError, match=r"'solution'.*train\.parquet.*'answer'.*data\.answer_key"):
        RLDataset(geo3k_parquet, tokenizer, processor, answer_key="solution")
    # prompts with <image> but no image column
    path = _write_jsonl(tmp_path / "noimg.jsonl", [{"problem": "<image>Find x.", "answer": "1"}])
    with pytest.raises(ValueError, match=r"row 0 of .*noimg\.jsonl.*no image column 'images'.*data\.image_key"):
        RLDataset(path, tokenizer, processor, **PIXELS)


def test_bad_sources_and_rows(vl, geo3k_sample_dir, tmp_path, monkeypatch):
    tokenizer, processor = vl
    with pytest.raises(DataError, match="missing.parquet"):
        RLDataset(str(tmp_path / "missing.parquet"), tokenizer, processor)
    (tmp_path / "data.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"data\.txt.*unsupported extension"):
        RLDataset(str(tmp_path / "data.txt"), tokenizer, processor)
    with pytest.raises(DataError, match="NAME@SPLIT"):
        RLDataset("someone/some_dataset", tokenizer, processor)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"hub dataset 'someone/some_dataset' split 'validation'"):
        RLDataset("someone/some_dataset@validation", tokenizer, processor)

    image = str(Path(geo3k_sample_dir) / "11" / "img_diagram.png")
    rows = [
        {"problem": "<image>ok", "answer": "1", "images": [image]},
        {"problem": "<image><image>two placeholders", "answer": "1", "images": [image]},
    ]
    path = _write_jsonl(tmp_path / "bad_count.jsonl", rows)
    with pytest.raises(ValueError, match=r"row 1 of .*bad_count\.jsonl.*2 <image> placeholders but 1 images"):
        RLDataset(path, tokenizer, processor, **PIXELS)
    rows[1] = {"problem": "<image>broken", "answer": "1", "images": [str(tmp_path / "gone.png")]}
    path = _write_jsonl(tmp_path / "bad_image.jsonl", rows)
    with pytest.raises(DataError, match=r"row 1 of .*bad_image\.jsonl.*gone\.png"):
        RLDataset(path, tokenizer, processor, **PIXELS)
    # rows are checked at construction also without the overlong filter
    with pytest.raises(DataError, match=r"row 1 of .*bad_image\.jsonl.*gone\.png"):
        RLDataset(path, tokenizer, processor, filter_overlong_prompts=False, **PIXELS)


def test_collate_fn_makes_plain_lists(vl, geo3k_parquet):
    tokenizer, processor = vl
    dataset = RLDataset(geo3k_parquet, tokenizer, processor, **PIXELS)
    items = [dataset[0], dataset[1], dataset[2]]
    batch = collate_fn(items)
    assert set(batch) == {"prompt_ids", "raw_prompt_ids", "images", "videos", "multi_modal_inputs", "ground_truth", "columns"}
    assert batch["prompt_ids"] == [item["prompt_ids"] for item in items]
    assert batch["ground_truth"] == ["80", "13", "9"]
    assert all(isinstance(image, Image.Image) for images in batch["images"] for image in images)
    restored = pickle.loads(pickle.dumps(dataset))  # DataLoader workers / Ray actors get a pickled copy
    assert restored[1]["prompt_ids"] == items[1]["prompt_ids"]
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_fn([items[0], {"prompt_ids": []}])
    with pytest.raises(ValueError, match="empty batch"):
        collate_fn([])


def test_format_prompt_template(tmp_path):
    template = load_format_prompt(MATH_TEMPLATE)
    rendered = template("  Find x.\n")
    assert rendered.startswith("Find x. ") and "<think> </think>" in rendered and "\\boxed{}" in rendered
    assert load_format_prompt(None)("as is") == "as is"
    custom = tmp_path / "t.jinja"
    custom.write_text("Q: {{ content }}\n")
    assert load_format_prompt(str(custom))("<image>hi") == "Q: <image>hi"
    with pytest.raises(ConfigError, match=r"nope\.jinja.*data\.format_prompt"):
        load_format_prompt(str(tmp_path / "nope.jinja"))
    (tmp_path / "bad.jinja").write_text("{{ content ")
    with pytest.raises(ValueError, match=r"bad\.jinja' \(data\.format_prompt\) line 1"):
        load_format_prompt(str(tmp_path / "bad.jinja"))
    (tmp_path / "other.jinja").write_text("{{ question }}")
    with pytest.raises(ValueError, match=r"other\.jinja.*undefined"):
        load_format_prompt(str(tmp_path / "other.jinja"))("x")


def test_pixel_bounds_follow_the_processor_and_qwen3_vl_factor_32(tiny_model_path, geo3k_parquet, caplog):
    path = tiny_model_path("qwen3_vl")
    tokenizer, processor = AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)
    image_processor = processor.image_processor
    factor = image_processor.patch_size * image_processor.merge_size  # 16 * 2
    longest = image_processor.size["longest_edge"]
    assert factor == 32 and longest < 4194304
    with caplog.at_level(logging.WARNING, logger="easyrl.data"):
        dataset = RLDataset(geo3k_parquet, tokenizer, processor)  # default bounds [262144, 4194304]
    assert f"narrowed to [262144, {longest}]" in caplog.text
    pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    for index in (0, 3):
        item = dataset[index]
        (image,) = item["images"]
        assert image.width % 32 == 0 and image.height % 32 == 0 and 262144 <= image.width * image.height <= longest
        grid = item["multi_modal_inputs"]["image_grid_thw"]
        assert grid.tolist() == [[1, image.height // 16, image.width // 16]]
        assert len(item["prompt_ids"]) == len(item["raw_prompt_ids"]) - 1 + int(grid.prod()) // 4
        assert item["prompt_ids"].count(pad_id) == int(grid.prod()) // 4
