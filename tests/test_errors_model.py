"""docs/errors.md, model entries (M..): ``worker.actor.model.*`` checked before Ray, each ending in one
``easyrl: model error: ...`` line naming the key, exit status 2, no traceback. A local-looking path is never taken for
a hub id, and the hub is asked at most once with a short timeout."""

from __future__ import annotations

import huggingface_hub
import huggingface_hub.constants
import pytest

from easyrl.config import ModelConfig
from easyrl.trainer.model_checks import check_chat_template, check_model_source, load_model_parts, looks_local

KEY = "worker.actor.model.model_path"


def _model(path, **kwargs) -> ModelConfig:
    return ModelConfig(model_path=str(path), **kwargs)


@pytest.fixture
def hub_calls(monkeypatch) -> list[str]:
    """Records every question to the hub (cache or network) instead of asking it."""
    calls: list[str] = []
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, *a, **k: calls.append(repo))
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo, **k: calls.append(repo))
    return calls


@pytest.mark.parametrize("path", ["./models/no-such-model", "/no/such/model", "models/qwen/7b", "~/no-such-model"],
                         ids=["M01", "M02", "M03", "M04"])
def test_local_looking_model_path_that_does_not_exist(expect_user_error, hub_calls, path):
    expect_user_error(lambda: load_model_parts(_model(path)), "model", f"{KEY}={path!r}", "does not exist")
    assert hub_calls == [], "a local path must not be looked up on the hub"


def test_folder_without_config_json(expect_user_error, tmp_path):  # M05
    expect_user_error(lambda: load_model_parts(_model(tmp_path)), "model", f"{KEY}={str(tmp_path)!r}", "config.json")


def test_model_path_is_a_file(expect_user_error, tmp_path):  # M06
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    expect_user_error(lambda: load_model_parts(_model(weights)), "model", f"{KEY}={str(weights)!r}", "is a file")


def test_hub_id_offline_and_not_cached(expect_user_error, monkeypatch):  # M07
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    expect_user_error(lambda: check_model_source(KEY, "easyrl-tests/no-such-model"), "model",
                      f"{KEY}='easyrl-tests/no-such-model'", "HF_HUB_OFFLINE")


def test_hub_id_unreachable_or_unknown_answers_at_once(expect_user_error, monkeypatch):  # M08
    """Without network the hub cannot be reached; with network it does not know this id: either way one message
    naming the key, after one request with a timeout (``check_model_source``), not a minute of retries."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    line = expect_user_error(lambda: check_model_source(KEY, "easyrl-tests/no-such-model-7f3c", timeout_s=5),
                             "model", f"{KEY}='easyrl-tests/no-such-model-7f3c'")
    assert "cannot be reached" in line or "no such model" in line


def test_tokenizer_path_that_does_not_exist(expect_user_error, tmp_path):  # M09
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    model = _model(tmp_path, tokenizer_path="./no/such/tokenizer")
    expect_user_error(lambda: load_model_parts(model), "model",
                      "worker.actor.model.tokenizer_path='./no/such/tokenizer'", "does not exist")


def test_config_json_that_is_not_json(expect_user_error, tmp_path):  # M10
    (tmp_path / "config.json").write_text("{not json")
    expect_user_error(lambda: load_model_parts(_model(tmp_path)), "model", "model config", f"{KEY}={str(tmp_path)!r}",
                      f"write {tmp_path / 'config.json'} as one JSON object", f"or set {KEY} to a model folder")


def test_config_json_with_unknown_model_type(expect_user_error, tmp_path):  # M11
    (tmp_path / "config.json").write_text('{"model_type": "qwen99"}')
    line = expect_user_error(lambda: load_model_parts(_model(tmp_path)), "model", "model config", f"{KEY}=",
                             "qwen99", f'set "model_type" in {tmp_path / "config.json"} to a type transformers',
                             "upgrade transformers", "worker.actor.model.trust_remote_code=true")
    assert "pip install --upgrade tran" not in line  # the library's first sentence only, not a cut-off paragraph


def test_tokenizer_without_chat_template(expect_user_error):  # M12
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    base_tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    where = f"{KEY}='/models/base'"
    expect_user_error(lambda: check_chat_template(base_tokenizer, None, where), "model", where, "no chat template")


def test_hub_ids_and_local_paths_are_told_apart(tmp_path):
    assert not looks_local("Qwen/Qwen2.5-VL-7B-Instruct") and not looks_local("gpt2")
    assert looks_local("./Qwen2.5") and looks_local("/models/q") and looks_local("a/b/c") and looks_local("~/m")
    assert looks_local(str(tmp_path))
