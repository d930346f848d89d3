"""The package's import graph, counting imports inside functions too: no circles (a circle makes the import order
matter and ties two modules' jobs together), and the layers hold:

- ``config/`` and ``engines/`` import nothing from ``workers/`` (the config validates names against the engines);
- the trainer and the rollout stages reach the workers only through the worker group: from ``workers/`` they import
  the worker class alone (``HybridWorker``, whose methods they name in their calls), nothing else;
- the trainer, the stages and the builder import Ray only inside the Ray path's functions, never at module level
  (``trainer.single_process`` runs without Ray);
- the CLI does not import the tools (the demo builds its assets; ``main`` never builds anything).
"""

from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "easyr1"


def module_name(path: Path) -> str:
    """``easyr1/tools/demo.py`` -> ``easyr1.tools.demo``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(module_level: bool = False) -> dict[str, set[str]]:
    """Every module of the package -> the modules it imports anywhere in its body (``module_level``: only in its
    top-level statements), the package's own by their full name and others by their top-level package."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body if module_level else ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(target for target in targets if target in modules and target != name)
            graph[name].update(target.split(".")[0] for target in targets if not target.startswith("easyr1"))
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for target in graph[node]:
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    assert "easyr1.build" in graph["easyr1.main"]  # imported inside a function: those count
    assert circles({name: {target for target in targets if target in graph} for name, targets in graph.items()}) == []


def imports_under(graph: dict[str, set[str]], importer: str, imported: str) -> dict[str, set[str]]:
    """The modules of package ``importer`` (or the module itself) that import modules of ``imported``."""
    found = {}
    for name, targets in graph.items():
        if name == importer or name.startswith(importer + "."):
            hits = {target for target in targets if target == imported or target.startswith(imported + ".")}
            if hits:
                found[name] = hits
    return found


def test_the_layers_hold():
    graph = import_graph()
    assert imports_under(graph, "easyr1.config", "easyr1.workers") == {}
    assert imports_under(graph, "easyr1.engines", "easyr1.workers") == {}
    assert imports_under(graph, "easyr1.main", "easyr1.tools") == {}
    for driver in ("easyr1.trainer", "easyr1.stages"):
        reached = imports_under(graph, driver, "easyr1.workers")
        assert all(targets == {"easyr1.workers.hybrid_worker"} for targets in reached.values()), reached
    assert "easyr1.workers.hybrid_worker" in graph["easyr1.trainer"]  # the finder sees what is there


def test_the_loop_imports_ray_only_on_its_ray_path():
    top_level = import_graph(module_level=True)
    for module in ("easyr1.trainer", "easyr1.build", "easyr1.stages.single_turn", "easyr1.stages.multi_turn"):
        assert "ray" not in top_level[module], module
    assert "ray" in top_level["easyr1.distributed.worker_group"]  # the finder sees Ray where it is imported
    assert "ray" in import_graph()["easyr1.build"]  # inside the Ray path's functions
