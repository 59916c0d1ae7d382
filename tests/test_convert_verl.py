"""``python -m easyrl.data.convert_verl``: a verl-format parquet file (written here the way verl's preprocessing
writes it) becomes easyrl's columns, which RLDataset reads with its defaults; and ``data.system_prompt``."""

from __future__ import annotations

import io

import datasets
import pytest
from PIL import Image
from transformers import AutoProcessor, AutoTokenizer

from easyrl.data.dataset import RLDataset
from easyrl.data.convert_verl import convert, main
from easyrl.errors import DataError

SYSTEM = "You are a careful geometry tutor."
PIXELS = {"min_pixels": 3136, "max_pixels": 200704}


def _png(color: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buffer, format="PNG")
    return buffer.getvalue()


def _verl_parquet(path, rows: int = 2, system: str | None = SYSTEM, images: bool = True, **override) -> str:
    """Rows as verl's examples/data_preprocess/geo3k.py writes them (images stored by datasets as an Image list)."""
    data = {
        "data_source": ["hiyouga/geometry3k"] * rows,
        "prompt": [([{"role": "system", "content": system}] if system else [])
                   + [{"role": "user", "content": f"<image>Find x in problem {i}."}] for i in range(rows)],
        "ability": ["math"] * rows,
        "reward_model": [{"style": "rule", "ground_truth": str(3 + i)} for i in range(rows)],
        "extra_info": [{"split": "train", "index": i} for i in range(rows)],
    }
    features = None
    if images:
        data["images"] = [[{"bytes": _png(c), "path": None}] for c in ("red", "blue", "green")[:rows]]
        features = datasets.Features({
            "data_source": datasets.Value("string"),
            "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            "ability": datasets.Value("string"),
            "reward_model": {"style": datasets.Value("string"), "ground_truth": datasets.Value("string")},
            "extra_info": {"split": datasets.Value("string"), "index": datasets.Value("int64")},
            "images": datasets.Sequence(datasets.Image()),
        })
    data.update(override)
    datasets.Dataset.from_dict(data, features=features if not override else None).to_parquet(str(path))
    return str(path)


@pytest.fixture(scope="module")
def vl(tiny_model_path):
    path = tiny_model_path("qwen2_5_vl")
    return AutoTokenizer.from_pretrained(path), AutoProcessor.from_pretrained(path)


def test_verl_parquet_converts_and_trains_as_easyrl_data(vl, tmp_path, capsys):
    src, dst = _verl_parquet(tmp_path / "verl.parquet"), str(tmp_path / "easyrl.parquet")
    assert main([src, dst]) == 0
    printed = capsys.readouterr().out
    assert f'system_prompt: "{SYSTEM}"' in printed and "columns problem, answer, images" in printed
    out = datasets.load_dataset("parquet", data_files=dst, split="train")
    assert out.column_names == ["problem", "answer", "images", "data_source"]
    assert out[1]["problem"] == "<image>Find x in problem 1." and out[1]["answer"] == "4"
    assert out[1]["images"][0].getpixel((0, 0)) == (0, 0, 255)  # the row's own image, decoded

    tokenizer, processor = vl
    dataset = RLDataset(dst, tokenizer, processor, system_prompt=SYSTEM, **PIXELS)
    item = dataset[1]
    text = tokenizer.decode(item["raw_prompt_ids"])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert "Find x in problem 1." in text and item["ground_truth"] == "4" and len(item["images"]) == 1
    without = tokenizer.decode(RLDataset(dst, tokenizer, processor, **PIXELS)[1]["raw_prompt_ids"])
    assert SYSTEM not in without  # no system_prompt: the chat template's default system message


def test_text_only_rows_without_system_message(tmp_path):
    src = _verl_parquet(tmp_path / "verl.parquet", system=None, images=False)
    assert convert(src, str(tmp_path / "out.parquet")) is None
    out = datasets.load_dataset("parquet", data_files=str(tmp_path / "out.parquet"), split="train")
    assert out.column_names == ["problem", "answer", "data_source"] and out[0]["answer"] == "3"


def test_ground_truth_that_is_not_a_string_becomes_json(tmp_path):
    src = _verl_parquet(tmp_path / "verl.parquet", rows=1, images=False,
                        reward_model=[{"style": "rule", "ground_truth": ["1", "2"]}])
    convert(src, str(tmp_path / "out.parquet"))
    assert datasets.load_dataset("parquet", data_files=str(tmp_path / "out.parquet"))["train"][0]["answer"] == \
        '["1", "2"]'


def test_multi_turn_prompt_is_refused_naming_the_row(tmp_path):  # D29
    multi_turn = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}]]
    src = _verl_parquet(tmp_path / "turns.parquet", rows=1, images=False, prompt=multi_turn)
    with pytest.raises(DataError, match=r"^row 0: the prompt's roles are \['user', 'assistant', 'user'\]; only a "
                                        r"single-turn prompt \(\[system,\] user\) can be converted$"):
        convert(src, str(tmp_path / "out.parquet"))


def test_different_system_messages_are_refused(tmp_path):  # D30
    systems = [[{"role": "system", "content": f"s{i}"}, {"role": "user", "content": "q"}] for i in range(2)]
    src = _verl_parquet(tmp_path / "systems.parquet", images=False, prompt=systems)
    with pytest.raises(DataError, match="the rows have 2 different system messages; data.system_prompt is one text"):
        convert(src, str(tmp_path / "out.parquet"))


def test_a_file_without_verl_columns_is_refused(tmp_path, capsys):  # D31
    plain = tmp_path / "plain.parquet"
    datasets.Dataset.from_dict({"problem": ["q"], "answer": ["1"]}).to_parquet(str(plain))
    capsys.readouterr()  # the progress bar of writing it
    assert main([str(plain), str(tmp_path / "out.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("easyrl: data error: ") and err.count("\n") == 1
    assert "has no column(s) ['prompt', 'reward_model'] of verl's format; its columns are ['problem', 'answer']" in err
