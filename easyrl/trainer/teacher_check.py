"""Pre-flight of on-policy distillation: the teacher scores the student's token ids as they are, so both need the
same vocabulary, special tokens and chat template rendering (docs/errors.md, T04-T06)."""

from __future__ import annotations

from typing import Any

from easyrl.errors import ConfigError
from easyrl.trainer.model_checks import load_part

PROBE_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 3 + 4?"}]
SPECIAL_TOKENS = ("eos_token", "pad_token", "bos_token")


def check_teacher(config: Any, student_tokenizer: Any) -> Any:
    """Check ``worker.teacher`` against the student's tokenizer; returns the teacher's tokenizer.

    Raises:
        ModelError: the teacher's tokenizer cannot be loaded.
        ConfigError: the vocabularies, special tokens or chat templates differ (naming both paths).
    """
    from transformers import AutoTokenizer

    teacher = config.worker.teacher.model
    teacher_tok_path = teacher.tokenizer_path or teacher.model_path
    teacher_tok = load_part("worker.teacher.model.model_path", teacher_tok_path, "tokenizer",
                            AutoTokenizer.from_pretrained, teacher.trust_remote_code)
    actor = config.worker.actor.model
    student_path = actor.tokenizer_path or actor.model_path
    both = f"the teacher {teacher_tok_path!r} (worker.teacher.model) and the student {student_path!r} " \
           "(worker.actor.model)"
    difference = vocabulary_difference(student_tokenizer, teacher_tok)
    if difference:
        raise ConfigError(f"{both} have different vocabularies ({difference}); on-policy distillation scores the "
                          "student's token ids with the teacher, so both need the same tokenizer: choose a teacher "
                          "of the student's model family.")
    for name in SPECIAL_TOKENS:
        mine, theirs = getattr(student_tokenizer, name, None), getattr(teacher_tok, name, None)
        if mine != theirs:
            raise ConfigError(f"{both} have different special tokens: {name} is {theirs!r} for the teacher and "
                              f"{mine!r} for the student; choose a teacher of the student's model family.")
    if config.data.override_chat_template is None:  # an override is the student's: the teacher sees its prompt ids
        mine, theirs = _render(student_tokenizer), _render(teacher_tok)
        if mine != theirs:
            raise ConfigError(f"{both} have different chat templates: a system + user prompt renders as "
                              f"{theirs!r} for the teacher and {mine!r} for the student; choose a teacher of the "
                              "student's model family, or set data.override_chat_template to the template both "
                              "were trained with.")
    return teacher_tok


def vocabulary_difference(student: Any, teacher: Any) -> str:
    """What differs between two tokenizers' vocabularies (token -> id, added tokens included), or ``""``."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return ""
    parts = [f"{len(mine)} tokens for the student, {len(theirs)} for the teacher"] if len(mine) != len(theirs) else []
    for token, index in sorted(mine.items(), key=lambda item: item[1]):
        if theirs.get(token) != index:
            where = f"id {theirs[token]}" if token in theirs else "absent"
            parts.append(f"{token!r} is id {index} for the student and {where} for the teacher")
            break
    else:
        extra = next(token for token in theirs if token not in mine)
        parts.append(f"the teacher has {extra!r} (id {theirs[extra]}), which the student lacks")
    return "; ".join(parts)


def _render(tokenizer: Any) -> str:
    """:data:`PROBE_MESSAGES` through the tokenizer's chat template, or a note that it has none."""
    if not getattr(tokenizer, "chat_template", None):
        return "<no chat template>"
    return tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
