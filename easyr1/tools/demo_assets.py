"""The demo's model and data, built on first use under ``.cache/demo``: the demo calls this before training, and
``python -m easyr1.tools.demo_assets`` builds them for ``examples/config_cpu.yaml`` and
``examples/config_agent_cpu.yaml``, and the judge demo's classifier (:mod:`easyr1.tools.demo_judge`; the CLI itself
never builds anything)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from easyr1.envs.target import ACTION_WORDS
from easyr1.tools.build_cache import DEMO_ROOT, build_once
from easyr1.tools.tiny_dataset import build_shape_dataset
from easyr1.tools.tiny_model import build_tiny_model


# The agent demo's model directory under ``root/model``: the demo model with the target task's action words.
AGENT_MODEL_NAME = "qwen2_5_vl_agent"


def _inside(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def prepare_demo_assets(config: Any) -> None:
    """Build the tiny model and shape data when the config points into ``.cache/demo`` and they are missing."""
    model_path = config.worker.actor.model.model_path
    if _inside(config.worker.reward_model.model_path, DEMO_ROOT):  # the judge demo's classifier
        from easyr1.tools.demo_judge import ensure_demo_judge

        ensure_demo_judge(config.worker.reward_model.model_path)
    if not (_inside(model_path, DEMO_ROOT) or _inside(config.data.train_files, DEMO_ROOT)):
        return
    family = Path(model_path).name if _inside(model_path, DEMO_ROOT) else "qwen2_5_vl"
    if family == AGENT_MODEL_NAME:
        ensure_agent_demo_model(DEMO_ROOT)
        return
    ensure_demo_assets(DEMO_ROOT, family=family)


def ensure_demo_assets(root: str | Path = ".cache/demo", family: str = "qwen2_5_vl") -> tuple[Path, Path]:
    """Build the tiny ``family`` model and the shape dataset under ``root`` if missing; return (model, data) dirs.

    The model goes to ``root/model/<family>``, the data to ``root/data`` (``train.jsonl``, ``val.jsonl``, images).
    """
    root = Path(root)
    model_dir = build_once(root / "model" / family, lambda path: build_tiny_model(path, family=family))
    data_dir = build_once(root / "data", build_shape_dataset)
    return model_dir, data_dir


def ensure_agent_demo_model(root: str | Path = DEMO_ROOT) -> Path:
    """Build the agent demo's model under ``root/model/qwen2_5_vl_agent`` if missing; return its directory.

    It is the demo's tiny Qwen2.5-VL (same sizes and seed) whose tokenizer also makes the ``target`` environment's
    action words single tokens, so one answer is one sampled token.
    """
    return build_once(
        Path(root) / "model" / AGENT_MODEL_NAME,
        lambda path: build_tiny_model(path, family="qwen2_5_vl", extra_words=ACTION_WORDS),
    )


def main() -> int:
    """Build the CPU demo's tiny models (single-turn and agent) and the shape data under ``.cache/demo``."""
    model_dir, data_dir = ensure_demo_assets(DEMO_ROOT)
    agent_dir = ensure_agent_demo_model(DEMO_ROOT)
    from easyr1.tools.demo_judge import ensure_demo_judge  # imported here: it builds on this module

    judge_dir = ensure_demo_judge()
    print(f"demo assets: model {model_dir}, agent model {agent_dir}, judge {judge_dir}, data {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
