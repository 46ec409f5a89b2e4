"""Every product module imports in a Python shaped like Windows' (no pwd, grp, fcntl, resource, uvloop; no
O_NOFOLLOW, pwrite, geteuid; no signal handlers on the loop; no /proc/net) — issue 45.

Before that issue 34 of 161 modules failed there (every entry point among them); the harness itself is checked
first, so that a harness that strips nothing cannot make the count pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stripped_python import stripped_env

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "store", "collectors", "pages", "sim")

PROBE = r"""
import asyncio, json, os, sys
out = {}
for name in ("pwd", "grp", "fcntl", "resource", "uvloop"):
    try:
        __import__(name)
        out[name] = "imported"
    except ImportError:
        out[name] = "blocked"
out["os"] = sorted(n for n in ("O_NOFOLLOW", "O_DIRECTORY", "pwrite", "geteuid") if hasattr(os, n))
loop = asyncio.new_event_loop()
try:
    loop.add_signal_handler(2, lambda: None)
    out["signal"] = "added"
except NotImplementedError:
    out["signal"] = "NotImplementedError"
try:
    open("/proc/net/tcp").read()
    out["proc_net"] = "read"
except PermissionError:
    out["proc_net"] = "PermissionError"
import psutil
out["psutil_listeners"] = len(psutil.net_connections("tcp")) >= 0
print(json.dumps(out))
"""

IMPORT_ALL = r"""
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except SystemExit:
        pass  # an entry point without a __main__ guard ran: it imported
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def product_modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def test_the_stripped_python_lacks_what_windows_lacks(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=stripped_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == {
        "pwd": "blocked",
        "grp": "blocked",
        "fcntl": "blocked",
        "resource": "blocked",
        "uvloop": "blocked",
        "os": [],
        "signal": "NotImplementedError",
        "proc_net": "PermissionError",
        "psutil_listeners": True,  # psutil, the OS's own view, still works
    }


def _failures(modules: list[str], env: dict[str, str] | None) -> dict[str, str]:
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *modules], env=env, cwd=REPO, capture_output=True, text=True, timeout=280
    )
    assert run.returncode == 0, run.stderr[-3000:]
    failed: dict[str, str] = json.loads(run.stdout.strip().splitlines()[-1])
    return failed


@pytest.mark.slow  # two interpreters import every module: ~25 s on the shared machine
def test_every_product_module_imports_in_the_stripped_python(tmp_path: Path) -> None:
    """Each module imports as in this machine's full Python: the same ones fail in both, and those are only
    Streamlit scripts that run their page at import and need a running app (not the OS)."""
    modules = product_modules()
    assert len(modules) > 150  # all of them, not a folder that moved
    # A page script runs at import: it reads the store and would start a collector. Both interpreters get one empty
    # folder and no collector, so neither reads nor changes the user's own store (a stale one there once made the
    # first interpreter fail on its schema and the second, after its collector migrated it, pass).
    isolated = {**os.environ, "PHASEWATCH_DATA": str(tmp_path / "data"), "PHASEWATCH_COLLECTOR": "off"}
    stripped = _failures(modules, stripped_env(tmp_path, isolated))
    full = _failures(modules, isolated)
    assert set(stripped) == set(full), f"{len(stripped)} of {len(modules)} modules do not import: {stripped}"
    assert all(name.startswith("pages.") and name.endswith(".page") for name in stripped), stripped
