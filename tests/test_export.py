"""Checkpoints and Hugging Face export without Ray: two gloo FSDP2 ranks save and reload a sharded checkpoint (model,
optimizer, scheduler, counters); only rank 0 holds the gathered full weights; ``python -m easyrl.export`` writes the
base model's dtype, its generation config byte for byte, files with the umask's mode (not safetensors' 0600),
and refuses to overwrite a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    """A Qwen2 config small enough to build in a second (vocab 512), declared bfloat16 like the hub's models, with a
    generation config of its own."""
    from transformers import GenerationConfig, Qwen2Config

    path = tmp_path_factory.mktemp("base")
    Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, tie_word_embeddings=False, dtype="bfloat16").save_pretrained(path)
    GenerationConfig(temperature=0.7, top_p=0.8, eos_token_id=[3, 4], do_sample=True).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_ranks(small_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests/scripts/fsdp_ranks.py"), str(small_model), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_sharded_checkpoint_round_trip_and_only_rank0_holds_full_weights(two_ranks):
    rank0, rank1 = (json.loads((two_ranks / f"rank_{r}.json").read_text()) for r in (0, 1))
    assert rank0["full_keys"] > 0 and rank1["full_keys"] == 0  # rank 1 never held a full copy
    for rank in (rank0, rank1):
        assert rank["optim_equal"] and (rank["num_updates"], rank["skips"], rank["scheduler_epoch"]) == (7, 1, 1)
    assert rank0["loaded_equal"]


def test_export_cli_writes_base_dtype_and_generation_config(two_ranks, small_model, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "easyrl.export", str(two_ranks / "global_step_1"), str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "generation_config.json").read_bytes() == (small_model / "generation_config.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    full = torch.load(two_ranks / "full.pt")
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        exported = {k: f.get_tensor(k) for k in f.keys()}
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}
    assert set(exported) == set(full)
    assert all(torch.equal(exported[k], full[k].to(torch.bfloat16)) for k in full)
    AutoModelForCausalLM.from_pretrained(out)
    umask = os.umask(0)
    os.umask(umask)
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == {f.name: 0o666 & ~umask for f in out.iterdir()}
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and again.stderr.startswith(f"easyrl: export error: {out} exists")  # never overwrites
    assert not list(tmp_path.glob(".hf.tmp"))


def test_config_dtype():
    from easyrl.models.hf_folder import config_dtype

    assert config_dtype({"dtype": "bfloat16"}) == torch.bfloat16
    assert config_dtype({"torch_dtype": "float16"}) == torch.float16
    assert config_dtype({}) == torch.float32 and config_dtype({"dtype": "auto"}) == torch.float32
    with pytest.raises(ValueError, match="int8"):
        config_dtype({"dtype": "int8"})
