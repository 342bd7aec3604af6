"""The lake's rooms import in one direction only: ``store`` ← ``write`` ← ``config`` ← ``run``,
with ``results`` and ``diagnosis`` below them all; no import cycle among the lake's modules,
counting the imports made inside functions (annotations only, under ``TYPE_CHECKING``, may
name a later room)."""

from __future__ import annotations

import ast
from pathlib import Path

import pgcdc.lake

LAKE = Path(pgcdc.lake.__file__).parent
#: a module's rank: it may import modules of its own rank or lower
RANKS = {"results": 0, "diagnosis": 0, "store": 1, "write": 2, "config": 3, "run": 4}


def _name(path: Path) -> str:
    parts = path.relative_to(LAKE.parent).with_suffix("").parts
    return ".".join(("pgcdc", *parts[: -1 if parts[-1] == "__init__" else None]))


def _rank(module: str) -> int | None:
    rest = module.removeprefix("pgcdc.lake.").split(".")[0]
    return RANKS.get(rest)


def _imports(path: Path) -> set[str]:
    """The ``pgcdc.lake`` modules ``path`` imports at run time, anywhere in it."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pgcdc.lake."):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pgcdc.lake."))
    return found


def _graph() -> dict[str, set[str]]:
    return {_name(path): _imports(path) for path in LAKE.rglob("*.py")}


def test_every_module_is_in_a_room() -> None:
    unranked = [m for m in _graph() if m != "pgcdc.lake" and _rank(m) is None]
    assert unranked == []


def test_rooms_import_downwards() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if module != "pgcdc.lake" and (_rank(target) or 0) > (_rank(module) or 0)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError(" -> ".join((*path[path.index(module) :], module)))
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
