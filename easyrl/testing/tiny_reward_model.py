"""A tiny random-weight reward model of a real architecture (``Qwen2ForSequenceClassification``, one output), for the
reward-model tests and demos: the tiny Qwen2.5 text stack of ``easyrl.testing.tiny`` with a scalar score head, the
Qwen2.5 tokenizer, and a chat template of its own (no system message), unlike the policy's, so that a test sees the
reward model's template applied rather than the policy's.

Usage: ``build_tiny_reward_model()`` or ``python -m easyrl.testing.tiny_reward_model [--output DIR]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from easyrl.testing.cache import build_atomically, cache_root
from easyrl.testing.tiny import PAD_ID, _qwen2_5_config
from easyrl.testing.tokenizer import build_qwen_tokenizer

BUILD_VERSION = 1
MARKER_FILE = ".easyrl_tiny_complete"

# The reward model's own template: user and assistant turns only (a Skywork-Reward-like layout), no system message.
RM_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def default_tiny_reward_model_dir() -> Path:
    """``$EASYRL_CACHE/tiny_models/qwen2_5_rm``."""
    return cache_root() / "tiny_models" / "qwen2_5_rm"


def _is_complete(path: Path) -> bool:
    try:
        return json.loads((path / MARKER_FILE).read_text()).get("version") == BUILD_VERSION
    except (OSError, ValueError):
        return False


def _write(out: Path, seed: int) -> None:
    from transformers import Qwen2ForSequenceClassification

    config = _qwen2_5_config()
    config.num_labels = 1
    config.pad_token_id = PAD_ID
    config.tie_word_embeddings = False
    config.architectures = ["Qwen2ForSequenceClassification"]
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification._from_config(config, dtype=torch.float32)
    torch.nn.init.normal_(model.score.weight, std=0.1)  # scores of a few units, so that samples differ visibly
    model.save_pretrained(out)  # float32: the tests compare scores at 1e-5
    build_qwen_tokenizer(RM_CHAT_TEMPLATE).save_pretrained(out)
    (out / MARKER_FILE).write_text(json.dumps({"arch": "qwen2_5_rm", "version": BUILD_VERSION, "seed": seed}))


def build_tiny_reward_model(output_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) the tiny reward model and return its folder.

    Returns:
        ``output_dir`` (default :func:`default_tiny_reward_model_dir`) holding ``config.json``
        (``Qwen2ForSequenceClassification``, ``num_labels: 1``, ``pad_token_id`` 151643), float32
        ``model.safetensors`` (~40M parameters, most of them the 151936-row embedding) and the tokenizer with
        :data:`RM_CHAT_TEMPLATE`; loadable with ``AutoModelForSequenceClassification`` / ``AutoTokenizer``. A
        complete build already there is returned at once; concurrent builders are safe (``build_atomically``).
    """
    final = Path(output_dir) if output_dir is not None else default_tiny_reward_model_dir()
    return build_atomically(final, _is_complete, lambda tmp: _write(tmp, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tiny random-weight reward model and print its folder.")
    parser.add_argument("--output", default=None, help="target folder (default: $EASYRL_CACHE/tiny_models/qwen2_5_rm)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_reward_model(args.output, args.seed))


if __name__ == "__main__":
    main()
