"""How the project's modules import each other: no cycle, and no private name taken from another module.

``lint-imports`` (scripts/test.sh) checks the layers and, with its acyclic_siblings
contract, cycles between the packages and modules inside each package; this test checks
every module against every other, with grimp's graph (the one import-linter builds).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGES = ("analysis", "store", "collectors", "pages", "sim")
# Owned by the store branch, which make these public or internal: drop each line when it lands.
KNOWN_PRIVATE_IMPORTS = {
    "store/export.py: store.queries._RECORD_SQL",
    "store/export.py: store.queries._record",
}
REPO = Path(__file__).resolve().parents[1]


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
    assert found == [
        "cyclepkg.a -> cyclepkg.b -> cyclepkg.c -> cyclepkg.a",
        "cyclepkg.b -> cyclepkg.c -> cyclepkg.a -> cyclepkg.b",
        "cyclepkg.c -> cyclepkg.a -> cyclepkg.b -> cyclepkg.c",
    ]


def private_imports(root: Path, packages: tuple[str, ...]) -> set[str]:
    """``from x import _name`` (or ``x._name``) where x is another module of ours: ``file: x._name``."""
    found = set()
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            aliases: dict[str, str] = {}  # local name -> module of ours
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages:
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            found.add(f"{path.relative_to(root)}: {node.module}.{a.name}")
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] in packages and a.asname:
                            aliases[a.asname] = a.name
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in aliases
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                ):
                    found.add(f"{path.relative_to(root)}: {aliases[node.value.id]}.{node.attr}")
    return found


@pytest.mark.slow
def test_no_private_name_imported_across_modules() -> None:
    assert private_imports(REPO, PACKAGES) - KNOWN_PRIVATE_IMPORTS == set()


def test_a_private_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "privpkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("_secret = 1\ndef _helper() -> None: ...\n")
    (pkg / "b.py").write_text("from privpkg.a import _secret\nfrom privpkg import a as mod\nmod._helper()\n")
    assert private_imports(tmp_path, ("privpkg",)) == {"privpkg/b.py: privpkg.a._secret", "privpkg/b.py: privpkg.a._helper"}


def imports_of_test_modules(root: Path) -> list[str]:
    """``file: module`` for each import of a test module (``test_*``, or a conftest) by a file under ``root/tests``:
    what tests share belongs in tests/support/ or in a conftest fixture, not in another test file."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts[1:]):
                    found.append(f"{path.relative_to(root)}: {name}")
                    break
    return found


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules(REPO) == []


def test_an_import_of_a_test_module_is_found(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "support").mkdir(parents=True)
    (tests / "support" / "helpers.py").write_text("")
    (tests / "test_a.py").write_text("X = 1\n")
    (tests / "test_b.py").write_text(
        "from tests.support.helpers import *\nfrom tests.test_a import X\ndef f() -> None:\n    import tests.conftest\n"
    )
    (tests / "test_c.py").write_text("from tests import test_a\n")
    assert imports_of_test_modules(tmp_path) == [
        "tests/test_b.py: tests.test_a",
        "tests/test_b.py: tests.conftest",
        "tests/test_c.py: tests.test_a",
    ]
