"""A report of a run that opens in any browser without a server: PNG plots of the main curves and a page of
rollouts — per logged step, the image(s), the prompt, and each response with its reward and sub-scores; for an
agent run, each response's episode turn by turn (the observation's images, the model's text, the parsed action,
the reward) with its return, success and truncation.

    python -m easyr1.tools.report EXPERIMENT_DIR      (the run's trainer.log_dir, where metrics.jsonl is)

Writes ``EXPERIMENT_DIR/report/index.html`` and ``EXPERIMENT_DIR/report/*.png``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from pathlib import Path

from easyr1.errors import UserError


# (file name, title, metric keys drawn together)
PLOTS = (
    ("reward", "Reward", ("reward/overall", "val/reward_score")),
    ("sub_scores", "Reward sub-scores", ("reward/format", "reward/accuracy", "val/format", "val/accuracy")),
    ("response_length", "Response length (tokens)", ("response_length/mean", "val/response_length/mean")),
    ("entropy", "Policy entropy", ("actor/entropy",)),
    ("loss", "Policy loss", ("actor/pg_loss", "actor/kl_loss")),
    ("grad_norm", "Gradient norm", ("actor/grad_norm",)),
    ("log_prob_gap", "Rollout vs trainer log-prob gap", ("rollout/log_prob_gap",)),
    ("success_rate", "Episode success rate", ("env/success_rate", "val/success_rate")),
    ("step_time", "Seconds per step", ("timing/step",)),
)


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file, skipping a last line cut short by a crash."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def write_plots(records: list[dict], out_dir: Path) -> list[Path]:
    """One PNG per entry of :data:`PLOTS` that has data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for name, title, keys in PLOTS:
        series = {
            key: [(r["step"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))] for key in keys
        }
        series = {key: points for key, points in series.items() if points and all(math.isfinite(v) for _, v in points)}
        if not series:
            continue
        figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
        for key, points in series.items():
            steps, values = zip(*points)
            axes.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=key)
        axes.set_title(title)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        path = out_dir / f"{name}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def _score_colour(score: float) -> str:
    """Red (0) to green (1) for a reward, so good and bad answers stand out."""
    score = min(max(score, 0.0), 1.0)
    return f"hsl({round(120 * score)}, 70%, 88%)"


def _image_tags(sources: list[str], alt: str) -> str:
    """``<img>`` tags for images logged under the run's directory (the page is one level below it)."""
    return "".join(f'<img src="../{html.escape(src)}" alt="{html.escape(alt)}">' for src in sources)


def episode_html(episode: dict) -> str:
    """An episode turn by turn: per turn the observation's images, the model's text, the parsed action (marked
    when invalid) and the reward; above, the episode's seed, return (the sum of its turns' rewards) and outcome."""
    returned = sum(turn["reward"] for turn in episode["turns"])
    outcome = ["success" if episode["success"] else "no success"] + (["truncated"] if episode["truncated"] else [])
    summary = (
        f"<p class=episode>seed {html.escape(str(episode['seed']))} · {len(episode['turns'])} "
        f"turn{'' if len(episode['turns']) == 1 else 's'} · "
        f"return <b>{returned:.3g}</b> · {' · '.join(outcome)}</p>"
    )
    rows = []
    for number, turn in enumerate(episode["turns"]):
        action = "none" if turn["action"] is None else html.escape(turn["action"])
        action_cell = (
            f"<td class=action>{action}</td>"
            if turn["action_valid"]
            else f"<td class='action invalid'>{action} (invalid)</td>"
        )
        rows.append(
            f"<tr><td>{number + 1}</td><td class=images>{_image_tags(turn['images'], f'observation {number + 1}')}"
            f"</td><td class=text>{html.escape(turn['text'])}</td>{action_cell}<td class=reward>{turn['reward']:.3g}"
            "</td></tr>"
        )
    head = "<tr><th>turn</th><th>observation</th><th>model's text</th><th>action</th><th>reward</th></tr>"
    return f"{summary}<table class=turns>{head}{''.join(rows)}</table>"


def rollouts_html(steps: list[dict]) -> str:
    """The rollout sections: per step, per prompt, its images, the prompt, and each response with its scores (an
    agent's response as its episode, turn by turn)."""
    parts = []
    for entry in steps:
        parts.append(f'<section><h2 id="step-{entry["step"]}">Step {entry["step"]}</h2>')
        for prompt in entry["prompts"]:
            images = _image_tags(prompt["images"], "input image")
            sub_keys = sorted({key for response in prompt["responses"] for key in response["sub_scores"]})
            head = "".join(f"<th>{html.escape(key)}</th>" for key in sub_keys)
            rows = []
            for response in prompt["responses"]:
                subs = "".join(f"<td>{response['sub_scores'].get(key, float('nan')):.3g}</td>" for key in sub_keys)
                shown = episode_html(response["episode"]) if "episode" in response else html.escape(response["text"])
                rows.append(
                    f'<tr style="background:{_score_colour(response["score"])}">'
                    f"<td class=text>{shown}</td>"
                    f"<td class=reward>{response['score']:.3g}</td>{subs}</tr>"
                )
            parts.append(
                f"<div class=prompt><div class=images>{images}</div><div class=body>"
                f"<pre>{html.escape(prompt['prompt'])}</pre>"
                f"<p>answer: <b>{html.escape(prompt['ground_truth'])}</b></p>"
                f"<table><tr><th>response</th><th>reward</th>{head}</tr>{''.join(rows)}</table></div></div>"
            )
        parts.append("</section>")
    return "".join(parts)


_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
.plots img { width: 460px; margin: 4px; border: 1px solid #ddd; }
.prompt { display: flex; gap: 1.5em; margin: 1em 0; padding: 1em; border: 1px solid #ccc; border-radius: 6px; }
.images img { width: 160px; image-rendering: pixelated; border: 1px solid #999; margin: 2px; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 0.5em; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #bbb; padding: 3px 8px; text-align: left; }
td.reward { font-weight: bold; }
table.turns { margin-top: 0.3em; background: #fff; }
table.turns td.images img { width: 96px; image-rendering: pixelated; border: 1px solid #999; margin: 1px; }
table.turns td.text { white-space: pre-wrap; }
td.invalid { color: #b00000; font-weight: bold; }
p.episode { margin: 0; }
"""


def write_report(experiment_dir: str | Path) -> Path:
    """Write the plots and ``report/index.html`` for the run in ``experiment_dir``; returns the HTML path."""
    experiment_dir = Path(experiment_dir)
    metrics_file = experiment_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise UserError(f"{experiment_dir} has no metrics.jsonl; pass a run's trainer.log_dir (with the file logger)")
    out_dir = experiment_dir / "report"
    out_dir.mkdir(exist_ok=True)
    plots = write_plots(read_jsonl(metrics_file), out_dir)
    rollouts_file = experiment_dir / "rollouts.jsonl"
    steps = read_jsonl(rollouts_file) if rollouts_file.is_file() else []
    plot_tags = "".join(f'<img src="{path.name}" alt="{path.stem}">' for path in plots)
    page = (
        f"<!doctype html><html><head><meta charset=utf-8><title>easyr1 report: {html.escape(experiment_dir.name)}"
        f"</title><style>{_STYLE}</style></head><body><h1>{html.escape(experiment_dir.name)}</h1>"
        f"<div class=plots>{plot_tags}</div><h1>Rollouts</h1>"
        f"{rollouts_html(steps) if steps else '<p>no rollouts logged (trainer.rollouts_to_log=0)</p>'}"
        "</body></html>"
    )
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> int:
    """CLI: write the report and print where it is."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment_dir", help="the run's directory (trainer.log_dir), holding metrics.jsonl")
    args = parser.parse_args(argv)
    try:
        index = write_report(args.experiment_dir)
    except UserError as error:
        print(f"report: error: {error}", file=sys.stderr)
        return 2
    print(f"report: plots in {index.parent}, rollouts in {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
