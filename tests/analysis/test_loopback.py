"""The product's one loopback test (analysis/loopback.py): one table of what it takes and refuses, and a guard that
no other module grows its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.loopback import is_loopback

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("analysis", "collectors", "pages", "sim", "store")

LOOPBACK = [
    "127.0.0.1",
    "127.8.9.1",
    "127.255.255.254",
    "::1",
    "[::1]",
    "::1%lo",  # a zone names the interface, the address is still ::1
    "[::1%lo]",
    "0:0:0:0:0:0:0:1",
    "::ffff:127.0.0.1",  # IPv4-mapped, as a dual-stack socket names an IPv4 peer
    "localhost",
    "LOCALHOST",
    "localhost.",
]
NOT_LOOPBACK = [
    "0.0.0.0",  # every address: reachable from other machines
    "::",
    "[::]",
    "127.0.0.1.evil.com",
    "localhost.evil.com",
    "evil-localhost",
    "[127.0.0.1]",  # brackets hold IPv6 only
    "[::1",
    "10.0.0.1",
    "192.168.1.5",
    "::ffff:10.0.0.1",
    "fe80::1%eth0",
    "128.0.0.1",
    "",
    None,
    " 127.0.0.1",  # callers strip; a padded string is not an address
]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_forms_are_taken(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_other_hosts_are_not_loopback(host: str | None) -> None:
    assert not is_loopback(host)


def _is_predicate_on_loopback(name: str) -> bool:
    """is_loopback, _is_loopback, is_loopback_host...: a yes/no on a host (free_loopback_port is not one)."""
    return name.lstrip("_").startswith("is_") and "loopback" in name


def test_no_other_module_defines_a_loopback_test() -> None:
    """Four copies once disagreed (one refused [::1]); a new one would drift again. Every user imports this one."""
    own = ROOT / "analysis" / "loopback.py"
    others = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == own:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_predicate_on_loopback(node.name):
                    others.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert others == [], f"use analysis.loopback.is_loopback instead of: {others}"
