"""The CPU demos: GRPO on a tiny Qwen2.5-VL that learns to name the colour of a shape in an image, or (``--env``)
an agent that learns to move a cursor onto a target it sees only in the image.

``python -m easyr1.tools.demo [--seed S] [--shuffle-images] [key=value ...]`` trains with
``examples/config_cpu.yaml`` (building the tiny model and data on first use) and ends with one line::

    demo: reward_first=<mean reward, first 10% of steps> reward_last=<last 10%> steps=<N> seconds=<wall>

``--shuffle-images`` is the control run: every prompt gets another row's image, so the answer cannot
be read from the picture and the reward must stay near the image-blind ceiling of 0.4.

``python -m easyr1.tools.demo --env target [--seed S] [--shuffle-images]`` trains the agent of
``examples/config_agent_cpu.yaml`` (episodes of up to 3 turns in the ``target`` environment) and ends with::

    demo-agent: success_first=<success rate, first 10% of steps> success_last=<last 10%> steps=<N> seconds=<wall>

There ``--shuffle-images`` shows every observation another episode's image (``env.shuffle_images``): the
image-blind control.

``python -m easyr1.tools.demo --schedule NAME [--seed S]`` trains the shape demo under an asynchronous schedule
(``async_training.schedule``; ``one_step_off`` on a split of one generator and one trainer, ``partial_rollout`` on
the two colocated workers) and ends with::

    demo-async: schedule=<name> reward_first=<x> reward_last=<y> steps=<N> seconds=<wall>

``python -m easyr1.tools.demo --judge [--seed S] [--shuffle-images]`` trains the shape demo on a reward model's scores
only (the classifier of :mod:`easyr1.tools.demo_judge`, built on first use; one-token answers, the judge's training
distribution; ``reward_function/shape_color_judge.py`` returns its score as the reward and logs the rule's
``accuracy`` beside it, never trained on) and ends with::

    demo-judge: accuracy_first=<rule accuracy, first 10% of steps> accuracy_last=<last 10%> judge_accuracy=<the
    judge's held-out accuracy> steps=<N> seconds=<wall>
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from easyr1.errors import UserError
from easyr1.tools.demo_assets import DEMO_ROOT, prepare_demo_assets
from easyr1.tools.demo_judge import judge_accuracy, judge_overrides


DEMO_CONFIG = "examples/config_cpu.yaml"
AGENT_DEMO_CONFIG = "examples/config_agent_cpu.yaml"
# the async_training keys each schedule of --schedule sets on the demo's two workers
SCHEDULE_OVERRIDES = {
    "sync": [],
    "one_step_off": ["async_training.placement=split", "async_training.generator_workers=1"],
    "partial_rollout": [],
}


def write_shuffled_copy(train_file: str, out_dir: Path, seed: int) -> Path:
    """A copy of ``train_file`` whose rows keep their prompts and answers but get another row's images."""
    source = Path(train_file)
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    images = [[str((source.parent / image).resolve()) for image in row["images"]] for row in rows]
    random.Random(seed).shuffle(images)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / source.name
    with target.open("w", encoding="utf-8") as file:
        for row, row_images in zip(rows, images):
            file.write(json.dumps({**row, "images": row_images}) + "\n")
    return target


def summarize(history: list[dict[str, float]], key: str = "reward/overall") -> tuple[float, float]:
    """Mean of ``key`` over the first and the last 10% of steps (at least one step each)."""
    window = max(1, math.ceil(len(history) * 0.1))
    first = sum(step[key] for step in history[:window]) / window
    last = sum(step[key] for step in history[-window:]) / window
    return first, last


def main(argv: list[str] | None = None) -> int:
    """Run the demo and print the summary line."""
    start = time.time()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="seed for data order, sampling and initialisation")
    parser.add_argument("--shuffle-images", action="store_true", help="control run: images shuffled across prompts")
    parser.add_argument("--env", help="train the agent demo in this environment (target) instead")
    parser.add_argument(
        "--schedule",
        choices=sorted(SCHEDULE_OVERRIDES),
        help="train under this async_training.schedule (one_step_off: 1 generator + 1 trainer) and print demo-async",
    )
    parser.add_argument(
        "--judge", action="store_true", help="train on a reward model's scores only and print demo-judge"
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides, key=value")
    args = parser.parse_args(argv)
    if args.env:
        if args.schedule:
            parser.error("--schedule trains the shape demo, not the agent demo: drop --env or --schedule")
        return agent_demo(args, start)
    if args.judge and args.schedule:
        parser.error("--judge trains the synchronous shape demo: drop --schedule or --judge")

    from easyr1.config import load_config

    schedule = f"_{args.schedule}" if args.schedule else "_judge" if args.judge else ""  # the run's name
    overrides = [
        f"config={DEMO_CONFIG}",
        f"data.seed={args.seed}",
        f"trainer.seed={args.seed}",
        f"worker.rollout.seed={args.seed}",
        f"trainer.experiment_name=shape_color_grpo{schedule}_seed{args.seed}",
        *schedule_overrides(args.schedule),
        *(judge_overrides() if args.judge else []),
        # each demo run trains from scratch; pass trainer.find_last_checkpoint=true to continue an interrupted one
        "trainer.find_last_checkpoint=false",
        # greedy answers on the 128 held-out images before training and every 50 steps
        "trainer.val_before_train=true",
        "trainer.val_freq=50",
        "worker.rollout.val_override_config={temperature: 0, n: 1}",
        *args.overrides,
    ]
    try:
        if args.shuffle_images:
            config = load_config(overrides)
            prepare_demo_assets(config)
            shuffled = write_shuffled_copy(config.data.train_files, DEMO_ROOT / "shuffled", args.seed)
            overrides += [
                f"data.train_files={shuffled}",
                f"trainer.experiment_name=shape_color{schedule}_shuffled_seed{args.seed}",
            ]
    except UserError as error:
        print(f"easyr1: error: {error}", file=sys.stderr)
        return 2
    finished = train(overrides)
    if finished is None:
        return 2
    config, metrics_file, records = finished
    history = [record for record in records if "reward/overall" in record]  # training steps, not step 0's validation
    validations = [record["val/reward_score"] for record in records if "val/reward_score" in record]
    first, last = summarize(history, "reward/accuracy" if args.judge else "reward/overall")
    print(f"per-step metrics: {metrics_file}")
    if validations:
        print(f"validation reward (greedy, held-out images): {' -> '.join(f'{v:.3f}' for v in validations)}")
    from easyr1.tools.report import write_report

    report = write_report(config.trainer.log_dir)
    print(f"report (plots and rollouts with their images, open in a browser): {report}")
    final_actor = Path(config.trainer.save_checkpoint_path) / f"global_step_{len(history)}" / "actor"
    print(f"final checkpoint: {final_actor} (export: python scripts/model_merger.py --local_dir {final_actor})")
    if args.judge:
        label = "demo-judge-control" if args.shuffle_images else "demo-judge"
        print(
            f"{label}: accuracy_first={first:.3f} accuracy_last={last:.3f} judge_accuracy={judge_accuracy():.3f} "
            f"steps={len(history)} seconds={time.time() - start:.0f}"
        )
        return 0
    label = "demo-async" if args.schedule else "demo"
    label += "-control" if args.shuffle_images else ""
    seconds = time.time() - start
    named = f" schedule={args.schedule}" if args.schedule else ""
    print(
        f"{label}:{named} reward_first={first:.3f} reward_last={last:.3f} steps={len(history)} seconds={seconds:.0f}"
    )
    return 0


def schedule_overrides(schedule: str | None) -> list[str]:
    """The ``async_training`` overrides of ``--schedule`` (none without it: the config's own schedule)."""
    if schedule is None:
        return []
    return [f"async_training.schedule={schedule}", *SCHEDULE_OVERRIDES[schedule]]


def train(overrides: list[str]) -> tuple[Any, Path, list[dict[str, float]]] | None:
    """Train with ``overrides``; returns the config, its metrics file and every record in it (the whole run's curve,
    also when this invocation resumed an interrupted run), or None after printing a user error."""
    from easyr1.config import load_config
    from easyr1.main import run

    try:
        prepare_demo_assets(load_config(overrides, validate=False))
        run(overrides)
    except UserError as error:
        print(f"easyr1: error: {error}", file=sys.stderr)
        return None
    config = load_config(overrides)
    metrics_file = Path(config.trainer.log_dir) / "metrics.jsonl"
    records = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines()]
    return config, metrics_file, records


def agent_demo(args: argparse.Namespace, start: float) -> int:
    """The agent demo (``--env``): train, then print the success rate of the first and last 10% of steps."""
    control = "_shuffled" if args.shuffle_images else ""
    overrides = [
        f"config={AGENT_DEMO_CONFIG}",
        f"env.name={args.env}",
        f"env.seed={args.seed * 100_000}",  # each demo seed its own episodes, apart from the validation seeds
        f"env.shuffle_images={str(args.shuffle_images).lower()}",
        f"trainer.seed={args.seed}",
        f"worker.rollout.seed={args.seed}",
        f"trainer.experiment_name={args.env}_grpo{control}_seed{args.seed}",
        "trainer.find_last_checkpoint=false",
        *args.overrides,
    ]
    finished = train(overrides)
    if finished is None:
        return 2
    config, metrics_file, records = finished
    history = [record for record in records if "env/success_rate" in record]
    first, last = summarize(history, "env/success_rate")
    print(f"per-step metrics: {metrics_file}")
    from easyr1.tools.report import write_report

    print(f"report (curves and episodes turn by turn, open in a browser): {write_report(config.trainer.log_dir)}")
    label = "demo-agent-control" if args.shuffle_images else "demo-agent"
    seconds = time.time() - start
    print(f"{label}: success_first={first:.3f} success_last={last:.3f} steps={len(history)} seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
