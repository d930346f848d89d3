"""The run report: PNG curves and a static rollout page, rendered in headless Chromium to check that the page
really shows the input images and the rewards."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from easyr1.errors import UserError
from easyr1.tools.report import NEUTRAL_COLOUR, write_report
from easyr1.tools.report import main as report_main


def fake_run(run_dir):
    """A run directory as the trainer writes it: metrics, rollouts and their images."""
    (run_dir / "rollouts" / "step_1").mkdir(parents=True)
    image = Image.new("RGB", (56, 56), (255, 255, 255))
    image.paste((220, 30, 30), (10, 10, 46, 46))
    image.save(run_dir / "rollouts" / "step_1" / "p0_i0.png")
    metrics = [{"step": s, "reward/overall": 0.1 * s, "actor/entropy": 5.0 - s, "timing/step": 1.0} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    responses = [
        {"text": "red", "score": 1.0, "sub_scores": {"format": 1.0, "accuracy": 1.0}},
        {"text": "blue <b>", "score": 0.2, "sub_scores": {"format": 1.0, "accuracy": 0.0}},
    ]
    prompt = {"prompt": "What colour?", "ground_truth": "red", "images": ["rollouts/step_1/p0_i0.png"]}
    (run_dir / "rollouts.jsonl").write_text(json.dumps({"step": 1, "prompts": [{**prompt, "responses": responses}]}))


def test_report_writes_plots_and_a_page_with_images_and_rewards(tmp_path):
    fake_run(tmp_path)
    index = write_report(tmp_path)
    plots = sorted(path.name for path in index.parent.glob("*.png"))
    assert plots == ["entropy.png", "reward.png", "step_time.png"]  # only the curves that have data
    for name in plots:
        pixels = np.asarray(Image.open(index.parent / name).convert("L"), dtype=float)
        assert pixels.std() > 10  # a drawn plot, not a blank canvas
    page = index.read_text()
    assert '<img src="../rollouts/step_1/p0_i0.png"' in page and '<img src="reward.png"' in page
    assert "blue &lt;b&gt;" in page  # model output is escaped, never interpreted as HTML
    assert "<td class=reward>1</td>" in page and "<td class=reward>0.2</td>" in page


def test_report_of_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(UserError, match="no metrics.jsonl"):
        write_report(tmp_path)
    assert report_main([str(tmp_path)]) == 2 and "report: error:" in capsys.readouterr().err


class _PageStructure(HTMLParser):
    """The tags and attributes a browser would build from the page (what an injected string would add to)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


HOSTILE_STEP = '3" onmouseover="alert(1)"><script>alert(2)</script>'


def test_report_survives_non_finite_rewards_and_hostile_rollouts(tmp_path):
    fake_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as file:  # a NaN reward in the metrics: a gap, not a crash
        file.write(json.dumps({"step": 3, "reward/overall": float("nan"), "actor/entropy": float("inf")}) + "\n")
        file.write("[1, 2]\n")  # a line of another shape
    script = "<script>alert('x')</script>"
    responses = [
        {"text": f"nan {script}", "score": float("nan"), "sub_scores": {"accuracy": float("inf"), "<b>k": "x<"}},
        {"text": "inf", "score": float("inf"), "sub_scores": {"accuracy": float("-inf")}},
        {"text": "-inf", "score": float("-inf"), "sub_scores": {}},
        {"text": "a string score", "score": '"><script>', "sub_scores": None},
        {"text": "half \x00\x1b[31m \ud800", "score": 0.5, "sub_scores": {"accuracy": 0.5}},
    ]
    episode = {"seed": script, "success": True, "truncated": False, "turns": [
        {"images": ["javascript:alert(1)", "/etc/passwd", 'a" onerror="x.png'], "text": script, "action": script,
         "action_valid": False, "reward": float("nan")},
    ]}  # fmt: skip
    prompt = {"prompt": script, "ground_truth": ["<i>", 1], "images": ['x" onload="alert(1).png']}
    lines = [
        {"step": HOSTILE_STEP, "prompts": [{**prompt, "responses": responses}]},
        {"step": "7", "prompts": [{"prompt": "p", "responses": [{"episode": episode, "score": float("nan")}]}]},
        {"step": 2.0, "prompts": "not a list"},
        "not an object",
    ]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    index = write_report(tmp_path)
    page = index.read_text()
    assert "reward.png" in {path.name for path in index.parent.glob("*.png")}  # steps 1 and 2 still drawn
    structure = _PageStructure()
    structure.feed(page)
    tags = {tag for tag, _ in structure.tags}
    assert "script" not in tags and tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "div",
                                             "img", "section", "pre", "p", "b", "table", "tr", "th", "td"}  # fmt: skip
    for tag, attrs in structure.tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        if "id" in attrs:
            assert re.fullmatch(r"step-[0-9]+", attrs["id"]), attrs
        if tag == "img":
            assert not attrs["src"].startswith(("../javascript", "..//")) and '"' not in attrs["src"], attrs
    ids = [attrs["id"] for _, attrs in structure.tags if "id" in attrs]
    assert ids == ["step-7", "step-2"]  # the hostile step gets no id; "7" and 2.0 are coerced
    assert "&lt;script&gt;" in page and "Step 3&quot; onmouseover" in page  # shown as text
    rows = [attrs["style"] for tag, attrs in structure.tags if tag == "tr" and "style" in attrs]
    assert rows[:5] == [f"background:{NEUTRAL_COLOUR}"] * 4 + ["background:hsl(60, 70%, 88%)"]
    assert "half \ufffd\ufffd[31m \ufffd" in page  # control characters and a lone surrogate, replaced
    for word in (">nan<", ">inf<", ">-inf<"):
        assert word in page


def chromium() -> str:
    """The chromium binary; installs Debian's package when missing (the test setup, as root with apt)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "chromium"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
            subprocess.run(install, env=env, capture_output=True, check=True)
        found = shutil.which("chromium")
    assert found, "chromium is needed to render the report (apt-get install chromium)"
    return found


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.e2e
def test_report_of_a_finished_run_renders_in_headless_chromium(validated_run, tmp_path):
    run_dir, _ = validated_run
    index = write_report(run_dir)
    assert {"reward.png", "entropy.png", "grad_norm.png"} <= {path.name for path in index.parent.glob("*.png")}
    logged = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in logged] == [1] and len(logged[0]["prompts"]) == 2
    assert len(logged[0]["prompts"][0]["responses"]) == 8  # every sample of the group, with its reward

    screenshot = tmp_path / "page.png"
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    rendered = subprocess.run(
        [*command, f"--screenshot={screenshot}", "--window-size=1300,2600", index.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert rendered.returncode == 0 and screenshot.is_file(), rendered.stderr[-2000:]
    pixels = np.asarray(Image.open(screenshot).convert("RGB"), dtype=int)
    assert pixels.std() > 20  # not a blank page
    # the shape images are the only saturated colours on the page: their pixels show the images loaded
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    saturated = (np.maximum(np.maximum(red, green), blue) - np.minimum(np.minimum(red, green), blue)) > 150
    assert saturated.sum() > 500
    dom = subprocess.run([*command, "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=180)
    assert '<td class="reward">' in dom.stdout or 'class="reward"' in dom.stdout
    assert dom.stdout.count("rollouts/step_1/") == 2
