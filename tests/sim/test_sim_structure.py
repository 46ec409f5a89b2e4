"""sim's modules import each other without cycles and never reach for another module's private names.

Read from the source with ``ast``, so imports inside functions count too (the late import that once hid
the ``sim.server`` <-> ``sim.openai_api`` cycle).
"""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import REPO

SIM = REPO / "sim"


def sim_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """For each sim module: (imported sim module, names taken from it) for every import statement."""
    graph: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(SIM.glob("*.py")):
        module = f"sim.{path.stem}"
        edges: list[tuple[str, list[str]]] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "sim":
                edges += [(f"sim.{a.name}", []) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sim."):
                edges.append((node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                edges += [(a.name, []) for a in node.names if a.name.startswith("sim.")]
        graph[module] = edges
    return graph


def test_the_walk_sees_the_imports_it_checks() -> None:
    graph = sim_imports()
    assert any(m == "sim.http" and "ApiError" in names for m, names in graph["sim.server"])
    assert any(m == "sim.streaming" for m, _ in graph["sim.openai_api"])


def test_no_private_name_is_imported_across_sim_modules() -> None:
    private = [
        f"{module} imports {name} from {target}"
        for module, edges in sim_imports().items()
        for target, names in edges
        for name in names
        if name.startswith("_") and target != module
    ]
    assert private == []


@pytest.mark.slow
def test_nothing_imports_a_private_name_of_sim() -> None:
    root = SIM.parent
    private = []
    for path in sorted(root.glob("[a-z]*/**/*.py")) + sorted(root.glob("*.py")):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sim"):
                private += [f"{path.relative_to(root)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def test_no_import_cycle_inside_sim() -> None:
    graph = {m: sorted({t for t, _ in edges if t != m}) for m, edges in sim_imports().items()}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for nxt in graph.get(module, []):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(module)

    for start in graph:
        if start not in done:
            visit(start, [start])
    assert cycles == []
