"""No import cycle among the project's modules.

``lint-imports`` (scripts/test.sh) checks the layers and, with its acyclic_siblings
contract, cycles between the packages and modules inside each package; this test checks
every module against every other, with grimp's graph (the one import-linter builds).
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

PACKAGES = ("analysis", "store", "collectors", "pages", "sim")
# Removed by the simdocs branch (sim's shared HTTP helpers in one module): drop this line when it lands.
KNOWN_IMPORTS_IN_CYCLES = {("sim.server", "sim.openai_api")}


def cycles(graph: grimp.ImportGraph) -> list[str]:
    """Each import that closes a cycle, written as the cycle: ``a -> b -> … -> a``."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.append(" -> ".join((importer, *back)))
    return found


def test_no_import_cycle_among_project_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 50 and graph.direct_import_exists(importer="analysis.roofline_cli", imported="analysis.ceilings")
    for importer, imported in KNOWN_IMPORTS_IN_CYCLES:
        if graph.direct_import_exists(importer=importer, imported=imported):
            graph.remove_import(importer=importer, imported=imported)
    assert cycles(graph) == []


def test_a_cycle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a three-module cycle in a throwaway package is reported, an acyclic import is not."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("from cyclepkg import c\n")
    (pkg / "c.py").write_text("import cyclepkg.a\nimport cyclepkg.d\n")
    (pkg / "d.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = cycles(grimp.build_graph("cyclepkg", cache_dir=None))
    assert found == ["cyclepkg.a -> cyclepkg.b -> cyclepkg.c -> cyclepkg.a",
                     "cyclepkg.b -> cyclepkg.c -> cyclepkg.a -> cyclepkg.b",
                     "cyclepkg.c -> cyclepkg.a -> cyclepkg.b -> cyclepkg.c"]  # fmt: skip
