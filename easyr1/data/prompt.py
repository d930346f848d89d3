"""Turn a row's raw prompt into chat messages: the Jinja format prompt, then image/video placement.

A format prompt is a Jinja file in which ``{{ content }}`` stands for the raw prompt text (see
``format_prompt/math.jinja``). ``<image>`` and ``<video>`` markers in the prompt say where each image or video
goes; when a prompt has images but no ``<image>`` marker, the images go first (likewise for videos).

Format prompts are rendered in Jinja's immutable sandbox: a template is data a user may have downloaded, and the
plain environment lets a template reach python internals (and from there the OS). The immutable sandbox is the one
transformers renders chat templates in; besides refusing private attributes it refuses methods that change lists,
dicts and sets, which a prompt template has no reason to call. Chat templates (``data.override_chat_template``)
are rendered by transformers, in that same sandbox.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from easyr1.data.checks import RowError
from easyr1.errors import DataError


IMAGE_MARKER = "<image>"
VIDEO_MARKER = "<video>"
_MARKER_PATTERN = re.compile(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})")


class FormatPrompt:
    """A format prompt compiled in Jinja's immutable sandbox, remembering its file for error messages."""

    def __init__(self, path: Path, template: jinja2.Template) -> None:
        self.path = path
        self.template = template

    def render(self, content: str) -> str:
        """The template applied to ``content``; DataError naming the file if the sandbox refuses it or it fails."""
        try:
            return self.template.render(content=content)
        except jinja2.exceptions.SecurityError as error:
            raise DataError(
                f"format prompt {self.path} tried something the template sandbox refuses ({error}); a prompt template "
                "may only format `content`. Fix the template or set data.format_prompt to a template you trust"
            ) from None
        except Exception as error:  # anything a template does wrong is the template's fault, not the run's
            raise DataError(
                f"format prompt {self.path} failed to render: {type(error).__name__}: {error}; fix the template"
            ) from None


def load_format_prompt(path: str | Path | None) -> FormatPrompt | None:
    """The Jinja template in ``path``, compiled in the sandbox (None if no path).

    Rendered once here on a sample text, so that a template the sandbox refuses stops the run when the dataset is
    built, before any model loads. DataError if the file is missing, not valid Jinja, or refused.
    """
    if path is None or str(path) == "":
        return None
    path = Path(path)
    if not path.is_file():
        raise DataError(f"format prompt file {path} does not exist; set data.format_prompt to a .jinja file or null")
    try:
        template = ImmutableSandboxedEnvironment(keep_trailing_newline=False).from_string(
            path.read_text(encoding="utf-8")
        )
    except jinja2.TemplateSyntaxError as error:
        raise DataError(f"format prompt {path} line {error.lineno}: invalid Jinja: {error.message}") from error
    format_prompt = FormatPrompt(path, template)
    format_prompt.render("What is 1 + 1?")
    return format_prompt


def load_chat_template(value: str | Path | None) -> str | None:
    """A chat template that replaces the tokenizer's: read from a file when ``value`` is a path, else used as is."""
    if value is None or str(value) == "":
        return None
    path = Path(value).expanduser()
    if path.suffix in (".jinja", ".j2", ".txt") or path.is_file():
        if not path.is_file():
            raise DataError(f"chat template file {path} does not exist; fix data.override_chat_template")
        return path.read_text(encoding="utf-8")
    return str(value)


def render_prompt(template: FormatPrompt | None, content: str) -> str:
    """Apply a format prompt to the raw prompt text (identity without one)."""
    if template is None:
        return content
    return template.render(content)


def build_messages(prompt: str, num_images: int, num_videos: int, where: str) -> list[dict[str, Any]]:
    """One user message whose content places ``num_images`` images and ``num_videos`` videos in ``prompt``.

    Text-only prompts give string content (works with any chat template); otherwise the content is a list of
    ``{"type": "text" | "image" | "video"}`` parts. Raises RowError (naming ``where``) when the number of
    markers in the prompt is neither 0 nor the number of images / videos.
    """
    image_markers = prompt.count(IMAGE_MARKER)
    video_markers = prompt.count(VIDEO_MARKER)
    for kind, markers, count in (("image", image_markers, num_images), ("video", video_markers, num_videos)):
        if markers not in (0, count):
            raise RowError(
                where,
                f"{kind} marker count",
                f"the prompt has {markers} <{kind}> marker(s) but the row has {count} {kind}(s)",
                f"use one marker per {kind} or none (then the {kind}s go before the text)",
            )
    if num_images == 0 and num_videos == 0:
        return [{"role": "user", "content": prompt}]

    parts: list[dict[str, Any]] = []
    if image_markers == 0:
        parts.extend({"type": "image"} for _ in range(num_images))
    if video_markers == 0:
        parts.extend({"type": "video"} for _ in range(num_videos))
    for piece in _MARKER_PATTERN.split(prompt):
        if piece == IMAGE_MARKER and num_images:
            parts.append({"type": "image"})
        elif piece == VIDEO_MARKER and num_videos:
            parts.append({"type": "video"})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return [{"role": "user", "content": parts}]
