"""The judge's request: a Jinja template rendered in the sandbox the format prompts use (``data/prompt.py``).

The template receives ``prompt`` (the prompt the policy saw, decoded as the reward function gets it), ``images``
(one ``<image>`` marker per image of the sample: where the template puts one, the judge sees that image; the judge's
processor expands it), ``response``, ``ground_truth`` and ``row`` (the sample's other dataset columns). The rendered
text becomes one user message of the judge's chat template (:func:`judge_messages`); images whose markers the
template leaves out go before the text, as in a dataset prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from easyr1.data.prompt import IMAGE_MARKER, build_messages
from easyr1.errors import ConfigError


TEMPLATE_KEY = "worker.reward_model.template"


class JudgeTemplate:
    """A judge template compiled in Jinja's immutable sandbox."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"{TEMPLATE_KEY}={self.path} does not exist; give a Jinja file")
        try:
            self.template = ImmutableSandboxedEnvironment(keep_trailing_newline=False).from_string(
                self.path.read_text(encoding="utf-8")
            )
        except jinja2.TemplateSyntaxError as error:
            raise ConfigError(
                f"{TEMPLATE_KEY}={self.path} line {error.lineno}: invalid Jinja: {error.message}"
            ) from None

    def render(self, prompt: str, num_images: int, response: str, ground_truth: Any, row: dict[str, Any]) -> str:
        """The judge's request text, with one ``<image>`` marker per image the template placed. ConfigError naming
        the file when the template fails or the sandbox refuses it."""
        try:
            return self.template.render(
                prompt=prompt,
                images=[IMAGE_MARKER] * num_images,
                response=response,
                ground_truth=ground_truth,
                row=row,
            )
        except jinja2.exceptions.SecurityError as error:
            raise ConfigError(
                f"{TEMPLATE_KEY}={self.path} tried something the template sandbox refuses ({error}); a judge template "
                "may only format prompt, images, response, ground_truth and row"
            ) from None
        except Exception as error:  # anything the template does wrong is the template's fault
            raise ConfigError(
                f"{TEMPLATE_KEY}={self.path} failed to render: {type(error).__name__}: {error}; fix the template"
            ) from None


def judge_messages(request: str, num_images: int) -> list[dict[str, Any]]:
    """The judge's chat: one user message placing the sample's images where the request has markers."""
    return build_messages(request, num_images, 0, "judge request")
