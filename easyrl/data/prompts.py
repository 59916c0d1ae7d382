"""Format-prompt templates (``data.format_prompt``): a Jinja2 file rendering ``content`` (the problem text,
placeholders included) into the user message, e.g. ``examples/format_prompt/math.jinja``."""

from __future__ import annotations

import os
import re
from typing import Any, Callable

import jinja2

from easyrl.errors import ConfigError


class FormatPrompt:
    """A loaded template, ``FormatPrompt(path)(content) -> str``. ConfigError: a missing file, invalid Jinja2
    (naming the line), a variable other than ``content``, or a template that does not show it."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ConfigError(
                f"format prompt template {self.path!r} does not exist (set data.format_prompt to an existing "
                ".jinja file, or to null to use the problem text as is)"
            )
        with open(self.path, encoding="utf-8") as f:
            self.source = f.read()
        self.template = self._compile()
        if "EASYRL_CONTENT" not in self("EASYRL_CONTENT"):
            raise ConfigError(f"format prompt template {self.path!r} (data.format_prompt) does not show the problem: "
                              "every prompt would be the same text; put {{ content }} where the problem goes.")

    def _compile(self) -> jinja2.Template:
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
        try:
            return env.from_string(self.source)
        except jinja2.TemplateSyntaxError as err:
            raise ConfigError(
                f"format prompt template {self.path!r} (data.format_prompt) line {err.lineno}: {err.message}"
            ) from err

    def __getstate__(self) -> dict:  # compiled templates do not pickle (DataLoader workers, Ray): keep the source
        return {"path": self.path, "source": self.source}

    def __setstate__(self, state: dict) -> None:
        self.path, self.source = state["path"], state["source"]
        self.template = self._compile()

    def __call__(self, content: str) -> str:
        """Render the template with ``content`` = the problem text; returns the user message text."""
        try:
            return self.template.render(content=content)
        except jinja2.UndefinedError as err:
            raise ConfigError(
                f"format prompt template {self.path!r} (data.format_prompt) uses an undefined variable "
                f"({err.message}); only `content` is passed"
            ) from err


def load_format_prompt(path: str | None) -> Callable[[str], str]:
    """The template at ``path`` as ``content -> user message`` (the identity, ``str``, for None)."""
    return str if path is None else FormatPrompt(path)


def user_content(text: str, n_images: int, n_videos: int, column: Callable[[str], str]) -> list[dict[str, Any]]:
    """The Qwen-VL content items of a user message: ``text`` cut at its ``<image>`` / ``<video>`` placeholders (media
    of a kind without placeholders go first). ValueError, naming ``column(kind)``, when a kind's placeholders are
    neither absent nor as many as its items."""
    placed = {}
    for kind, count in (("image", n_images), ("video", n_videos)):
        placed[kind] = text.count(f"<{kind}>")
        if placed[kind] and placed[kind] != count:
            raise ValueError(f"the prompt has {placed[kind]} <{kind}> placeholders but {count} {kind}s: "
                             f"{column(kind)}")
    content = [{"type": kind} for kind, count in (("image", n_images), ("video", n_videos)) if not placed[kind]
               for _ in range(count)]
    for j, piece in enumerate(re.split("(<image>|<video>)", text)):
        if j % 2:
            content.append({"type": piece[1:-1]})
        elif piece:
            content.append({"type": "text", "text": piece})
    return content
