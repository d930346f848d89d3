"""Tiny reward models for tests and demos: a random tiny VLM as a generative judge, or with a random value head as a
classifier (the checkpoint format of :mod:`easyr1.reward_model.classifier`), plus a judge template.

``python -m easyr1.tools.tiny_judge OUT_DIR [--kind classifier|judge] [--seed 1]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


# A judge template: the sample's images, then the question, the response and the expected answer.
TEMPLATE = (
    "{% for image in images %}{{ image }}{% endfor %}Question: {{ prompt }}\n"
    "Response: {{ response }}\nExpected: {{ ground_truth }}\nScore from 0 to 10:"
)


def build_tiny_judge(out_dir: str | Path, kind: str = "judge", seed: int = 1) -> Path:
    """A tiny random Qwen2.5-VL (the shape demo's tokenizer) in ``out_dir``; for ``kind=classifier`` with a value
    head drawn from ``seed`` (standard normal, scaled so that scores spread over a few units). Returns the path."""
    from easyr1.models.loading import load_model
    from easyr1.reward_model.classifier import save_value_head
    from easyr1.tools.tiny_model import build_tiny_model
    from easyr1.workers.critic import ValueModel

    out_dir = build_tiny_model(out_dir, family="qwen2_5_vl", seed=seed)
    if kind == "classifier":
        model = ValueModel(load_model(str(out_dir), torch.float32))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=generator))
            model.value_head.bias.zero_()
        save_value_head(model, out_dir)
    elif kind != "judge":
        raise ValueError(f"unknown reward model kind {kind!r}; classifier or judge")
    return out_dir


def write_template(path: str | Path, text: str = TEMPLATE) -> Path:
    """A judge template file at ``path``."""
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    """Command line entry point: build a tiny reward model directory (and its judge template)."""
    parser = argparse.ArgumentParser(description="Build a tiny random reward model for tests and demos.")
    parser.add_argument("out_dir", help="directory to write the model into (created if missing)")
    parser.add_argument("--kind", default="judge", choices=("classifier", "judge"), help="reward model kind")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random weights")
    args = parser.parse_args(argv)
    path = build_tiny_judge(args.out_dir, args.kind, args.seed)
    if args.kind == "judge":
        write_template(path / "judge.jinja")
    print(path)


if __name__ == "__main__":
    main()
