"""Ulysses sequence parallelism (``easyrl.models.ulysses``): the same log-probs, entropies and gradients with the
packed row split over 2 gloo ranks as without it; the head check; the config key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import Qwen2Config

from easyrl.models.ulysses import check_heads

REPO = Path(__file__).resolve().parents[1]


# measured (fp32): log-probs equal, entropies within 1e-6, gradients within 4e-7 (of ~0.3); breaking the all-to-all
# moves the log-probs by ~0.7, dropping the sum's backward halves the gradients
# Qwen3-VL: mRoPE, the vision tower, deepstack features; Qwen3-MoE: routing replay, each rank its slice of the routing
@pytest.mark.parametrize("arch", ["qwen2_5", "qwen3_vl", "qwen3_moe"])
def test_sp2_equals_sp1_log_probs_entropies_and_gradients(tiny_model_path, tmp_path, arch):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests/scripts/ulysses_ranks.py"), str(tiny_model_path(arch)), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["log_prob_diff"] < 1e-5 and result["entropy_diff"] < 1e-4 and result["value_diff"] < 1e-5
    assert result["grad_diff"] < 1e-5 * max(1.0, result["grad_scale"])
    assert result["routing_mismatch"] == 0  # R2's recorded routing: the same gathered over the group as alone


def test_heads_not_divisible_are_refused_with_the_numbers():
    config = Qwen2Config(num_attention_heads=28, num_key_value_heads=4)
    check_heads(config, 4)
    with pytest.raises(ValueError, match=r"ulysses_size=8 must divide .* heads \(28\) and key/value heads \(4\).*"
                                         r"choose one of 1, 2, 4"):
        check_heads(config, 8)
