"""A report of a run that opens in any browser without a server: PNG plots of the main curves and a page of
rollouts — per logged step, the image(s), the prompt, and each response with its reward and sub-scores; for an
agent run, each response's episode turn by turn (the observation's images, the model's text, the parsed action,
the reward) with its return, success and truncation. A run under an asynchronous schedule (``async/`` metrics) gets
a panel of its own: staleness, partial spans, waiting, tokens/s and the train-vs-engine mismatch per sample age.

    python -m easyr1.tools.report EXPERIMENT_DIR      (the run's trainer.log_dir, where metrics.jsonl is)

Writes ``EXPERIMENT_DIR/report/index.html`` and ``EXPERIMENT_DIR/report/*.png``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
import urllib.parse
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

# The asynchronous schedule's panel (easyr1.schedules), drawn only for a run that logged ``async/`` metrics.
ASYNC_PLOTS = (
    ("async_staleness", "Sample staleness (weight versions)", ("async/staleness/mean", "async/staleness/max")),
    (
        "async_span",
        "Partial responses: versions spanned, share continued",
        ("async/span/mean", "async/span/max", "async/partial_ratio"),
    ),
    (
        "async_waiting",
        "Share of the step spent waiting",
        ("async/trainer_wait_ratio", "async/generator_idle_ratio"),
    ),
    ("async_tokens_per_second", "Tokens per second", ("throughput/tokens_per_second",)),
)
# (file name, title, metric under rollout_corr/by_staleness/<s>/): one curve per sample age s
MISMATCH_PLOTS = (
    ("async_mismatch_gap", "Train vs engine |log-prob gap| by staleness", "log_prob_gap"),
    ("async_mismatch_k3_kl", "Train vs engine k3 KL by staleness", "k3_kl"),
)
BY_STALENESS = re.compile(r"rollout_corr/by_staleness/([0-9]+)/(.+)")


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
    return [path for name, title, keys in PLOTS if (path := _plot(records, out_dir, name, title, keys)) is not None]


def has_async_metrics(records: list[dict]) -> bool:
    """Whether the run trained under an asynchronous schedule (its steps logged ``async/`` metrics)."""
    return any(isinstance(record, dict) and any(key.startswith("async/") for key in record) for record in records)


def write_async_plots(records: list[dict], out_dir: Path) -> list[Path]:
    """The asynchronous schedule's panel: one PNG per entry of :data:`ASYNC_PLOTS` and :data:`MISMATCH_PLOTS` that
    has data; nothing for a run without ``async/`` metrics (a synchronous run). Returns the files written."""
    if not has_async_metrics(records):
        return []
    written = [path for name, title, keys in ASYNC_PLOTS if (path := _plot(records, out_dir, name, title, keys))]
    ages = sorted(
        {
            (int(match[1]), match[2])
            for record in records
            if isinstance(record, dict)
            for key in record
            if (match := BY_STALENESS.fullmatch(key))
        }
    )
    for name, title, metric in MISMATCH_PLOTS:
        keys = tuple(f"rollout_corr/by_staleness/{age}/{metric}" for age, logged in ages if logged == metric)
        labels = {f"rollout_corr/by_staleness/{age}/{metric}": f"staleness {age}" for age, _ in ages}
        if (path := _plot(records, out_dir, name, title, keys, labels)) is not None:
            written.append(path)
    return written


def _plot(
    records: list[dict],
    out_dir: Path,
    name: str,
    title: str,
    keys: tuple[str, ...],
    labels: dict[str, str] | None = None,
) -> Path | None:
    """``out_dir/<name>.png``: a curve over the steps per key of ``keys`` (its legend ``labels[key]``, else the key);
    ``None`` (nothing written) when no key has a value."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    # a point per record with a finite step and value: a NaN or infinite value (or a line of another shape)
    # leaves a gap in its curve, not a missing plot
    series = {
        key: [
            (step, value)
            for record in records
            if isinstance(record, dict)
            and (step := _finite(record.get("step"))) is not None
            and (value := _finite(record.get(key))) is not None
        ]
        for key in keys
    }
    series = {key: points for key, points in series.items() if points}
    if not series:
        return None
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    for key, points in series.items():
        steps, values = zip(*points)
        label = (labels or {}).get(key, key)
        axes.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=label)
    axes.set_title(title)
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path = out_dir / f"{name}.png"
    figure.savefig(path)
    plt.close(figure)
    return path


# The row colour of a score that is not a finite number (NaN, inf, missing or not a number): a plain grey that
# reads as neither good nor bad.
NEUTRAL_COLOUR = "hsl(0, 0%, 90%)"


def _finite(value: object) -> float | None:
    """``value`` as a finite float; ``None`` for NaN, infinities, booleans and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _score_colour(score: object) -> str:
    """Red (0) to green (1) for a reward, so good and bad answers stand out; :data:`NEUTRAL_COLOUR` for a score
    that is not a finite number."""
    number = _finite(score)
    if number is None:
        return NEUTRAL_COLOUR
    return f"hsl({round(120 * min(max(number, 0.0), 1.0))}, 70%, 88%)"


# Characters a page must not hold: control characters (a model's text can have any) and lone surrogates (JSON can
# spell them, UTF-8 cannot encode them).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _text(value: object) -> str:
    """Any logged value as HTML text: ``str`` of it, escaped (quotes included, so it is safe in attributes too), with
    unprintable characters shown as U+FFFD."""
    text = value if isinstance(value, str) else str(value)
    return html.escape(_UNPRINTABLE.sub("\ufffd", text), quote=True)


def _number(value: object) -> str:
    """A reward or sub-score as text: 3 significant digits, ``nan`` / ``inf`` / ``-inf`` as words, anything else
    escaped as it was logged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"  # Python writes non-finite floats as nan, inf, -inf
    return _text(value)


def _step_number(value: object) -> int | None:
    """The step as an ``int`` (for the ``id`` of its section); ``None`` when the logged value is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        return int(value)
    return None


def _mapping(value: object) -> dict:
    """``value`` if it is a JSON object, else an empty one (a hand-edited or foreign file renders what it can)."""
    return value if isinstance(value, dict) else {}


def _items(value: object) -> list:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _image_tags(sources: object, alt: str) -> str:
    """``<img>`` tags for images logged under the run's directory (the page is one level below it); anything else
    (an absolute path, a URL, which would make the page fetch from elsewhere) is left out."""
    tags = []
    for source in _items(sources):
        if not isinstance(source, str) or not source or source.startswith(("/", "\\")) or ":" in source:
            continue
        tags.append(f'<img src="../{html.escape(urllib.parse.quote(source), quote=True)}" alt="{_text(alt)}">')
    return "".join(tags)


def episode_html(episode: dict) -> str:
    """An episode turn by turn: per turn the observation's images, the model's text, the parsed action (marked
    when invalid) and the reward; above, the episode's seed, return (the sum of its turns' rewards) and outcome."""
    turns = [_mapping(turn) for turn in _items(episode.get("turns"))]
    rewards = [_finite(turn.get("reward")) for turn in turns]
    # the return is a number only when every turn's reward is one; otherwise it says which value broke it
    broken = [turn.get("reward") for turn, reward in zip(turns, rewards) if reward is None]
    returned = _number(sum(reward for reward in rewards if reward is not None)) if not broken else _number(broken[0])
    outcome = ["success" if episode.get("success") else "no success"] + (
        ["truncated"] if episode.get("truncated") else []
    )
    summary = (
        f"<p class=episode>seed {_text(episode.get('seed'))} · {len(turns)} "
        f"turn{'' if len(turns) == 1 else 's'} · "
        f"return <b>{returned}</b> · {' · '.join(outcome)}</p>"
    )
    rows = []
    for number, turn in enumerate(turns):
        action = "none" if turn.get("action") is None else _text(turn["action"])
        action_cell = (
            f"<td class=action>{action}</td>"
            if turn.get("action_valid", True)
            else f"<td class='action invalid'>{action} (invalid)</td>"
        )
        rows.append(
            f"<tr><td>{number + 1}</td>"
            f"<td class=images>{_image_tags(turn.get('images'), f'observation {number + 1}')}</td>"
            f"<td class=text>{_text(turn.get('text', ''))}</td>{action_cell}"
            f"<td class=reward>{_number(turn.get('reward'))}</td></tr>"
        )
    head = "<tr><th>turn</th><th>observation</th><th>model's text</th><th>action</th><th>reward</th></tr>"
    return f"{summary}<table class=turns>{head}{''.join(rows)}</table>"


def rollouts_html(steps: list) -> str:
    """The rollout sections: per step, per prompt, its images, the prompt, and each response with its scores (an
    agent's response as its episode, turn by turn).

    Every logged value is escaped or coerced before it reaches the page, so any ``rollouts.jsonl`` renders: a step
    that is not an integer gets no ``id``, scores that are not finite numbers show as text on a neutral row, and
    entries of the wrong shape are skipped.
    """
    parts = []
    for entry in steps:
        if not isinstance(entry, dict):
            continue
        step = _step_number(entry.get("step"))
        anchor = f' id="step-{step}"' if step is not None else ""
        parts.append(f"<section><h2{anchor}>Step {_text(entry.get('step'))}</h2>")
        for prompt in map(_mapping, _items(entry.get("prompts"))):
            images = _image_tags(prompt.get("images"), "input image")
            responses = [_mapping(response) for response in _items(prompt.get("responses"))]
            sub_keys = sorted({str(key) for response in responses for key in _mapping(response.get("sub_scores"))})
            head = "".join(f"<th>{_text(key)}</th>" for key in sub_keys)
            # worker.reward_model: a judge's raw text (or a classifier's score) beside the response
            judged = any(isinstance(response.get("reward_model"), dict) for response in responses)
            head += "<th>reward model</th>" if judged else ""
            rows = []
            for response in responses:
                sub_scores = {str(key): value for key, value in _mapping(response.get("sub_scores")).items()}
                subs = "".join(f"<td>{_number(sub_scores.get(key, float('nan')))}</td>" for key in sub_keys)
                if judged:
                    judgement = _mapping(response.get("reward_model"))
                    text = judgement.get("text")
                    unread = "" if judgement.get("parsed", True) else " (unparseable)"
                    said = f"<br>{_text(text)}" if text is not None else ""
                    subs += f"<td class=text>{_number(judgement.get('score'))}{unread}{said}</td>"
                episode = response.get("episode")
                shown = episode_html(episode) if isinstance(episode, dict) else _text(response.get("text", ""))
                rows.append(
                    f'<tr style="background:{_score_colour(response.get("score"))}">'
                    f"<td class=text>{shown}</td>"
                    f"<td class=reward>{_number(response.get('score'))}</td>{subs}</tr>"
                )
            parts.append(
                f"<div class=prompt><div class=images>{images}</div><div class=body>"
                f"<pre>{_text(prompt.get('prompt', ''))}</pre>"
                f"<p>answer: <b>{_text(prompt.get('ground_truth', ''))}</b></p>"
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
    records = read_jsonl(metrics_file)
    plots = write_plots(records, out_dir)
    async_plots = write_async_plots(records, out_dir)
    rollouts_file = experiment_dir / "rollouts.jsonl"
    steps = read_jsonl(rollouts_file) if rollouts_file.is_file() else []
    plot_tags = "".join(f'<img src="{path.name}" alt="{path.stem}">' for path in plots)
    async_panel = (
        "<h1>Asynchronous schedule</h1><div class='plots async'>"
        + "".join(f'<img src="{path.name}" alt="{path.stem}">' for path in async_plots)
        + "</div>"
        if async_plots
        else ""
    )
    page = (
        f"<!doctype html><html><head><meta charset=utf-8><title>easyr1 report: {html.escape(experiment_dir.name)}"
        f"</title><style>{_STYLE}</style></head><body><h1>{html.escape(experiment_dir.name)}</h1>"
        f"<div class=plots>{plot_tags}</div>{async_panel}<h1>Rollouts</h1>"
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
