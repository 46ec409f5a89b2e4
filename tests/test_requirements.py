"""Every third-party package the code imports is named in a requirements file, not only brought in by another.

A package that arrives only as a dependency of another (numpy and pandas through Streamlit, yarl through aiohttp)
can leave with that package's next release; a direct import is a direct requirement.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import REPO

OWN_PACKAGES = {"analysis", "collectors", "store", "sim", "pages", "app", "scripts", "tests", "bench"}
PRODUCT = ["analysis", "collectors", "store", "sim", "pages", "app.py"]


def _named_in(*files: str) -> set[str]:
    """The canonical distribution names the requirements files list (following `-r`)."""
    names: set[str] = set()
    for file in files:
        for raw in (REPO / file).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("-r "):
                names |= _named_in(line.removeprefix("-r ").strip())
            elif line:
                names.add(canonicalize_name(Requirement(line).name))
    return names


def _imported_modules(*roots: str) -> dict[str, str]:
    """Top-level third-party module -> one file that imports it (static imports, lazy ones inside functions too)."""
    found: dict[str, str] = {}
    for root in roots:
        path = REPO / root
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OWN_PACKAGES:
                        found.setdefault(top, str(file.relative_to(REPO)))
    return found


def _unlisted(modules: dict[str, str], listed: set[str]) -> list[str]:
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(modules.items()):
        provided_by = {canonicalize_name(d) for d in distributions.get(module, [module])}
        if not provided_by & listed:
            missing.append(f"{module} (imported in {where}; from {sorted(provided_by)})")
    return missing


def test_every_package_the_product_imports_is_in_requirements_txt() -> None:
    assert _unlisted(_imported_modules(*PRODUCT), _named_in("requirements.txt")) == []


def test_every_package_the_tests_scripts_and_bench_import_is_in_a_requirements_file() -> None:
    listed = _named_in("requirements-dev.txt", "requirements-engine.txt")
    assert _unlisted(_imported_modules("tests", "scripts", "bench"), listed) == []
