"""Every config key acts or says it does not: each field of PPOConfig is read by code outside the config package,
or is declared compatibility-only (accepted for EasyR1 YAMLs, named in a start-up notice when set).

"Read" is found in the source, not assumed: every ``easyr1/**/*.py`` outside ``easyr1/config/`` is parsed, and the
names it loads as attributes (``x.name``) or asks ``getattr``/``hasattr`` for by a constant string are collected. A
field counts as read when its name is among them. Names are not tied to their section: a name read for the actor
(``offload_params``) also counts for the reference's field of the same name.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from easyr1.config import PPOConfig, compatibility_only_keys, compatibility_only_settings, describe
from easyr1.config.fields import acts_through, is_section, iter_fields, mirror, option, section


PACKAGE = Path(__file__).resolve().parents[1] / "easyr1"
CONFIG_PACKAGE = PACKAGE / "config"


def _is_getattr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
    )


def _literal_strings(function: ast.AST) -> set[str]:
    """The string keys and items of the literal dicts, lists, tuples and sets inside ``function``."""
    strings: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Dict):
            items = node.keys
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        else:
            continue
        strings.update(item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str))
    return strings


def names_read(files: list[Path]) -> set[str]:
    """Attribute names loaded (``x.name``) and names given to ``getattr``/``hasattr`` in ``files``.

    A constant name counts directly. A function that asks for a computed name (``getattr(config, name)`` over a
    table of option names, as ``RLDataset.from_config`` does) reads the names listed in its literal dicts, lists and
    tuples.
    """
    names: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif _is_getattr(node) and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                names.add(node.args[1].value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _is_getattr(inner) and not isinstance(inner.args[1], ast.Constant) for inner in ast.walk(node)
            ):
                names.update(_literal_strings(node))
    return names


def code_outside_config() -> list[Path]:
    """Every python file of the package except the config package itself (which touches every field)."""
    return [path for path in sorted(PACKAGE.rglob("*.py")) if CONFIG_PACKAGE not in path.parents]


def unread_keys(root: type, read: set[str]) -> list[str]:
    """Dotted keys of ``root``'s tree that are neither read (by name) nor declared compatibility-only.

    A mirror or an alias acts through the key it is copied or translated to, so it counts when that key does.
    """
    declared = compatibility_only_keys(root)
    fields = {key: item for key, item, hint in iter_fields(root) if not is_section(hint)}

    def acts(key: str) -> bool:
        target = acts_through(fields[key])
        if target is not None:
            return acts(target)
        return key in declared or fields[key].name in read

    return [key for key in fields if not acts(key)]


@dataclasses.dataclass
class _Inner:
    used_knob: int = option(1, "read below")
    unused_knob: int = option(2, "read by nothing")
    legacy_knob: int = option(3, "EasyR1 only", compatibility_only=True)
    old_used_knob: int | None = option(None, "older name", alias_for="inner.used_knob")
    copy_of_unused: int = mirror(2, "inner.unused_knob")
    copy_of_legacy: int = mirror(3, "inner.legacy_knob")


@dataclasses.dataclass
class _Legacy:
    anything: int = option(0, "inside a compatibility-only section")


@dataclasses.dataclass
class _Root:
    inner: _Inner = section(_Inner, "a section")
    legacy: _Legacy = section(_Legacy, "EasyR1 only", compatibility_only=True)


def test_the_walk_finds_a_field_nothing_reads(tmp_path):
    source = tmp_path / "user.py"
    source.write_text("def f(config):\n    return config.inner.used_knob + getattr(config, 'other')\n")
    read = names_read([source])
    assert {"inner", "used_knob", "other"} <= read
    # the mirror of an unread key is as unread as its source; the alias and the mirror of a declared key act
    assert unread_keys(_Root, read) == ["inner.unused_knob", "inner.copy_of_unused"]


def test_a_stored_attribute_is_not_a_read(tmp_path):
    source = tmp_path / "user.py"
    source.write_text("def f(config):\n    config.inner.unused_knob = 3\n")
    assert "unused_knob" not in names_read([source])


def test_every_config_field_is_read_or_compatibility_only():
    unread = unread_keys(PPOConfig, names_read(code_outside_config()))
    assert not unread, (
        "config keys read by no code outside easyr1/config/ and not declared compatibility-only "
        "(wire them, or declare them with option(..., compatibility_only=True)):\n  " + "\n  ".join(unread)
    )


def test_compatibility_only_settings_name_only_keys_set_away_from_their_default():
    root = _Root()
    assert compatibility_only_settings(root) == []
    root.inner.legacy_knob, root.inner.unused_knob, root.legacy.anything = 4, 5, 6
    assert compatibility_only_settings(root) == ["inner.legacy_knob=4", "legacy.anything=6"]


def test_describe_marks_the_compatibility_only_keys():
    declared = compatibility_only_keys(PPOConfig)
    for line in describe().splitlines():
        key = line.split(":", 1)[0]
        assert ("compatibility-only" in line) == (key in declared), line


def test_the_cli_names_a_compatibility_only_key_once_at_start_up(capsys, tmp_path):
    from easyr1.main import main

    args = [
        f"worker.actor.model.model_path={tmp_path / 'no_model_here'}",
        f"worker.reward.reward_function={PACKAGE.parent / 'reward_function' / 'math.py'}:compute_score",
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=8",
        "worker.rollout.n=2",
        "trainer.n_gpus_per_node=1",
        "worker.rollout.tensor_parallel_size=1",
        "worker.actor.fsdp.mp_buffer_dtype=float32",
    ]
    assert main(args) == 2  # stops at the missing model, after the notice
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if "EasyR1 compatibility" in line]
    assert notices == [
        "easyr1: notice: accepted for EasyR1 compatibility, no effect here: worker.actor.fsdp.mp_buffer_dtype=float32"
    ]
    assert "easyr1: error: worker.actor.model.model_path=" in err
