"""docs/architecture.md's Batch table names every field the driver and the workers exchange.

The fields are found in the source: keys written into a batch (``batch["x"] = ...``) by the trainer, the rollout
stages, the hybrid worker and the rollout engines, names passed to ``Batch.select``, keys of ``Batch(tensors=...)``
literals, and the field tuples of the actor and the sample cache. A new field that crosses a worker call without a
row in the table fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from easyr1.distributed.sample_cache import PROMPT_FIELDS, RESPONSE_FIELDS
from easyr1.protocol import ACTOR_FIELDS


REPO = Path(__file__).resolve().parents[1]
SOURCES = [
    REPO / "easyr1" / "trainer.py",
    REPO / "easyr1" / "workers" / "hybrid_worker.py",
    *sorted((REPO / "easyr1" / "stages").glob("*.py")),
    *sorted((REPO / "easyr1" / "engines").glob("*.py")),
]
BATCH_NAMES = {"batch", "prompts", "output", "out", "rows", "experience"}


def fields_in_source(source: str) -> set[str]:
    """Batch fields a module writes, selects or builds (see the module docstring)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Subscript)
                        and isinstance(part.value, ast.Name)
                        and part.value.id in BATCH_NAMES
                        and isinstance(part.slice, ast.Constant)
                        and isinstance(part.slice.value, str)
                    ):
                        found.add(part.slice.value)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "select":
                found.update(arg.value for arg in node.args if isinstance(arg, ast.Constant))
            if isinstance(node.func, ast.Name) and node.func.id == "Batch":
                for keyword in node.keywords:
                    if keyword.arg in ("tensors", "non_tensors") and isinstance(keyword.value, ast.Dict):
                        found.update(key.value for key in keyword.value.keys if isinstance(key, ast.Constant))
    return found


def documented_fields() -> set[str]:
    """The backquoted names in the first column of the Batch fields table."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("### Batch fields", 1)[1].split("\n### ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row)}


def test_the_field_finder_sees_writes_selects_and_literals():
    source = 'batch["a"] = 1\nx = batch.select("b", "c")\ny = Batch(tensors={"d": t})\nother["e"] = 2\n'
    assert fields_in_source(source) == {"a", "b", "c", "d"}


def test_every_field_that_crosses_a_worker_call_is_in_the_batch_table():
    fields = {*ACTOR_FIELDS, *PROMPT_FIELDS, *RESPONSE_FIELDS}
    for path in SOURCES:
        fields |= fields_in_source(path.read_text(encoding="utf-8"))
    assert "rollout_log_probs" in fields and "advantages" in fields  # the finder reads the real sources
    missing = sorted(fields - documented_fields())
    assert not missing, f"add rows for {missing} to the Batch fields table of docs/architecture.md"
