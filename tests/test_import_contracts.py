"""The "only page and ui files import Streamlit" contract holds modules nobody has listed: it is written by rule.
The relay's rooms (collectors/proxy/relay/) keep their order: a room importing one above it breaks its contract.

Each test copies the packages and pyproject.toml (the contract as it stands, unedited) into a temporary folder, adds
one module, and runs the real ``lint-imports`` there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
COPIED = ("analysis", "store", "collectors", "pages", "sim", "scripts", "pyproject.toml")
CONTRACT = "under pages/, only page and ui files import Streamlit"
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


def contract_line(output: str) -> str:
    """The summary line of our contract (import-linter may wrap a long name, so match its start)."""
    return next(line for line in output.splitlines() if line.startswith(CONTRACT[:40]) and line.endswith(("KEPT", "BROKEN")))


def test_the_copy_as_it_stands_keeps_the_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_of_repo(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert contract_line(result.stdout).endswith("KEPT")


def test_a_new_requests_module_importing_streamlit_breaks_the_unedited_contract(tmp_path: Path) -> None:
    root = copy_of_repo(tmp_path)
    (root / "pages" / "requests" / "export_button.py").write_text("import streamlit as st\n\nBUTTON = st.button\n")
    result = lint_imports(root)
    assert result.returncode == 1
    assert contract_line(result.stdout).endswith("BROKEN")
    assert "pages.requests.export_button -> streamlit" in result.stdout


def test_a_module_reaching_streamlit_through_a_ui_file_breaks_it_too(tmp_path: Path) -> None:
    """Importing a page's ui file imports Streamlit: the exemption is for the ui file, not for what imports it."""
    root = copy_of_repo(tmp_path)
    (root / "pages" / "live" / "helper.py").write_text("from pages.live import ui\n\nUI = ui\n")
    result = lint_imports(root)
    assert result.returncode == 1
    assert contract_line(result.stdout).endswith("BROKEN")
    assert "pages.live.helper -> pages.live.ui" in result.stdout


def test_a_new_page_or_ui_file_may_import_streamlit(tmp_path: Path) -> None:
    root = copy_of_repo(tmp_path)
    (root / "pages" / "requests" / "ui.py").write_text("import streamlit as st\n\nBUTTON = st.button\n")
    result = lint_imports(root)
    assert result.returncode == 0, result.stdout
    assert contract_line(result.stdout).endswith("KEPT")


RELAY_CONTRACT = "the relay's rooms import only the rooms below them"


def relay_contract_line(output: str) -> str:
    return next(
        line for line in output.splitlines() if line.startswith(RELAY_CONTRACT[:40]) and line.endswith(("KEPT", "BROKEN"))
    )


def test_the_upstream_side_importing_the_client_side_breaks_the_relay_rooms_contract(tmp_path: Path) -> None:
    """The upstream side sees its client connection through a Protocol: importing the client side, which imports
    it, would make the two rooms one tangle again."""
    root = copy_of_repo(tmp_path)
    upstream = root / "collectors" / "proxy" / "relay" / "upstream_side.py"
    upstream.write_text(upstream.read_text() + "\nfrom collectors.proxy.relay import client_side  # noqa: E402\n")
    result = lint_imports(root)
    assert result.returncode == 1
    assert relay_contract_line(result.stdout).endswith("BROKEN")
    assert "collectors.proxy.relay.upstream_side -> collectors.proxy.relay.client_side" in result.stdout
