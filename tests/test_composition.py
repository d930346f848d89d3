"""How the loop is put together: the Trainer is given its parts and only orders them; it drives the stage through the
stage interface and the workers through typed calls (worker methods by reference, checked before any call).

The runs that show the composition working (in one process, on Ray, on a GPU) are in ``test_single_process.py`` and
``tests/gpu``; these are the in-process checks of the contracts themselves.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest
from helpers import demo_config

from easyr1.distributed.local_group import LocalWorkerGroup
from easyr1.distributed.worker import Worker, method_name
from easyr1.engines import ENGINES
from easyr1.reward_model.worker import RewardModelWorker
from easyr1.stages import RolloutStage
from easyr1.stages.multi_turn import MultiTurnStage
from easyr1.stages.single_turn import SingleTurnStage
from easyr1.trainer import Trainer
from easyr1.workers.hybrid_worker import HybridWorker


PACKAGE = Path(__file__).resolve().parents[1] / "easyr1"


class Untouchable:
    """A part the constructor must only store: any use of it fails the test."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the Trainer's constructor used its part ({name})")


def test_the_trainer_constructor_only_wires_its_parts(tiny_qwen2_5_vl_dir, tiny_dataset_dir, monkeypatch):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "algorithm.adv_estimator=gae")

    def no_io(*args, **kwargs):
        raise AssertionError(f"the Trainer's constructor opened a file: {args[:1]}")

    parts = {name: Untouchable() for name in ("workers", "stage", "prompts", "checkpoints", "tokenizer", "scorer")}
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", no_io)
        patch.setattr(Path, "open", no_io)
        trainer = Trainer(config, trackers=[], total_steps=7, **parts)
    assert trainer.global_step == 0 and trainer.total_steps == 7
    assert trainer.uses_critic and not trainer.uses_reference  # what it derives, it derives from the config alone
    assert all(getattr(trainer, name) is part for name, part in parts.items())


def test_the_trainer_module_names_no_engine_and_tests_no_stage_type():
    source = (PACKAGE / "trainer.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    assert not [call for call in calls if call.func.id in ("isinstance", "type")], "dispatch on the stage's type"
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & set(ENGINES.names()), strings & set(ENGINES.names())
    assert "ray" not in {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                         for alias in node.names}  # fmt: skip


@pytest.mark.parametrize("stage", [SingleTurnStage, MultiTurnStage])
def test_each_stage_has_the_whole_interface(stage):
    for member in ("collect", "validate", "sampling"):
        ours = inspect.signature(getattr(stage, member))
        theirs = inspect.signature(getattr(RolloutStage, member))
        assert list(ours.parameters) == list(theirs.parameters), (stage.__name__, member)
    assert "rows_per_sample" in inspect.getsource(stage)  # a class attribute, or set from the config


class Probe(Worker):
    def echo(self, value):
        return value


class OverridingProbe(Probe):
    def echo(self, value):
        return ("overridden", value)


def test_worker_calls_name_the_method_itself():
    assert method_name(Probe, Probe.echo) == "echo"
    assert method_name(OverridingProbe, Probe.echo) == "echo"  # the subclass's override is what runs
    assert method_name(Probe, Worker.clear_sample_cache) == "clear_sample_cache"  # inherited
    with pytest.raises(TypeError, match="pass the method itself"):
        method_name(Probe, "echo")
    with pytest.raises(TypeError, match="is not a method of Probe"):
        method_name(Probe, HybridWorker.generate)


def test_the_in_process_group_calls_the_worker_by_reference(rank_environment):
    group = LocalWorkerGroup(OverridingProbe)
    try:
        assert group.run_all(Probe.echo, 3) == [("overridden", 3)]
        with pytest.raises(TypeError):
            group.run_all("echo", 3)
    finally:
        group.shutdown()


def worker_calls(path: Path) -> list[tuple[int, str, str]]:
    """Every ``run_all`` / ``run_split`` call of a module: (line, class, method) of the method it passes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("run_all", "run_split") and node.args:
                method = node.args[0]
                assert isinstance(method, ast.Attribute) and isinstance(method.value, ast.Name), (path, node.lineno)
                found.append((node.lineno, method.value.id, method.attr))
    return found


def test_every_worker_call_of_the_driver_names_a_method_of_the_worker():
    calls = [(path.name, *call) for path in PACKAGE.rglob("*.py") for call in worker_calls(path)]
    assert len(calls) >= 10  # the finder sees the trainer's and the stages' calls
    for file, line, owner, method in calls:
        cls = {"HybridWorker": HybridWorker, "Worker": Worker, "RewardModelWorker": RewardModelWorker}[owner]
        assert callable(getattr(cls, method, None)), f"{file}:{line} calls {owner}.{method}, which does not exist"
