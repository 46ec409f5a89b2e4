"""The real ``lint-imports`` run over a copy of the packages and pyproject.toml (the contracts as they stand,
unedited), so that a test can add a module or an import to the copy and see what the contracts say."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
COPIED = ("analysis", "store", "collectors", "pages", "sim", "scripts", "pyproject.toml")
LINT_TIMEOUT_S = 120  # ~1 s alone; generous for a loaded 2-core machine


def copy_of_repo(into: Path) -> Path:
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, into / name)
    return into


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=LINT_TIMEOUT_S, check=False
    )


def contract_line(output: str, contract: str) -> str:
    """The summary line of a contract (import-linter may wrap a long name, so match its start)."""
    return next(line for line in output.splitlines() if line.startswith(contract[:40]) and line.endswith(("KEPT", "BROKEN")))
