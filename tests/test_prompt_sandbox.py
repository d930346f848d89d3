"""Format prompts are rendered in Jinja's sandbox: a template that reaches for python internals is a DataError naming
its file, raised when the dataset is built, and nothing it asked for runs; every shipped template renders exactly
what the plain Jinja environment renders."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from transformers import AutoTokenizer

from easyr1.data import RLDataset
from easyr1.data.prompt import load_format_prompt, render_prompt
from easyr1.errors import DataError


REPO = Path(__file__).resolve().parents[1]
SHIPPED_TEMPLATES = sorted([*REPO.glob("format_prompt/*.jinja"), *REPO.glob("examples/**/*.jinja")])
SAMPLE_CONTENTS = [
    "What is 1 + 1?",
    "  <image>Find the area of the triangle.\nAnswer in cm^2.  ",
    "Solve $x^2 - 4 = 0$ {{ not a variable }} {% raw %} \\boxed{} é 中文",
    "",
]


def unsafe_template(marker: Path) -> str:
    return "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}{{ content }}"


def test_shipped_templates_exist():
    assert [path.name for path in SHIPPED_TEMPLATES if path.parent.name == "format_prompt"], SHIPPED_TEMPLATES


@pytest.mark.parametrize("path", SHIPPED_TEMPLATES, ids=lambda path: str(path.relative_to(REPO)))
@pytest.mark.parametrize("content", SAMPLE_CONTENTS)
def test_shipped_templates_render_as_the_plain_environment_does(path, content):
    plain = jinja2.Environment(keep_trailing_newline=False).from_string(path.read_text(encoding="utf-8"))
    assert render_prompt(load_format_prompt(path), content) == plain.render(content=content)


def test_the_plain_environment_runs_the_escape_so_the_test_below_means_something(tmp_path):
    marker = tmp_path / "MARKER"
    jinja2.Environment().from_string(unsafe_template(marker)).render(content="x")
    assert marker.exists()


def test_an_unsafe_template_is_refused_at_load_naming_the_file_and_nothing_runs(tmp_path):
    marker = tmp_path / "MARKER"
    template = tmp_path / "downloaded.jinja"
    template.write_text(unsafe_template(marker), encoding="utf-8")
    with pytest.raises(DataError, match=r"format prompt .*downloaded\.jinja .*sandbox refuses"):
        load_format_prompt(template)
    assert not marker.exists()


def test_an_unsafe_branch_taken_by_one_row_stops_the_dataset_check(tmp_path, tiny_qwen2_5_vl_dir):
    """The escape hides behind a condition the load-time render does not meet: the dataset check, which renders
    every row's prompt before any model loads, meets it and names the file."""
    marker = tmp_path / "MARKER"
    template = tmp_path / "sneaky.jinja"
    template.write_text(
        "{% if 'trigger' in content %}" + unsafe_template(marker) + "{% else %}{{ content }}{% endif %}",
        encoding="utf-8",
    )
    data = tmp_path / "rows.jsonl"
    rows = [{"problem": "plain question", "answer": "1"}, {"problem": "trigger", "answer": "2"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl_dir)
    with pytest.raises(DataError, match=r"format prompt .*sneaky\.jinja .*sandbox refuses"):
        RLDataset(str(data), tokenizer, None, prompt_key="problem", max_prompt_length=64, format_prompt=str(template))
    assert not marker.exists()


def test_a_template_that_fails_to_render_names_the_file(tmp_path):
    template = tmp_path / "broken.jinja"
    template.write_text("{{ content }}{{ 1 / 0 }}", encoding="utf-8")
    with pytest.raises(DataError, match=r"format prompt .*broken\.jinja failed to render: ZeroDivisionError"):
        load_format_prompt(template)
