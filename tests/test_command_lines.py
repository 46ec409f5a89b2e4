"""Every command line answers alike (analysis/command_line.py, docs/settings.md): one meaning of --since/--until and
one set of exit codes. The real commands run as child processes over a real store."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.command_line import MAX_AGE_S, MAX_TIME_CHARS, TIME_HELP, ExitCode, parse_time
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.collector_process import collector
from tests.support.paths import REPO
from tests.support.records import make_record

T0 = 1_750_000_000.0  # 2025-06-15T15:06:40Z
PRODUCT_PACKAGES = ("analysis", "collectors", "pages", "sim", "store")
# The commands that read a store, as a user types them (the data folder goes after).
STORE_COMMANDS = {
    "store export": ["-m", "store", "export", "--data"],
    "pages.report": ["-m", "pages.report", "--data"],
    "pages.why": ["-m", "pages.why", "--json", "--data"],
}


def _run(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "PHASEWATCH_"))} | {"COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """Requests at T0 - 1 day, T0 and T0 + 1 h, in a real store file."""
    w = StoreWriter(db_path(tmp_path))
    w.apply([PutRequest(make_record(rid, t)) for rid, t in (("old", T0 - 86400), ("a", T0), ("b", T0 + 3600))])
    w.close()
    return tmp_path


# -- the parser --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1750000000", T0),
        ("1750000000.5", T0 + 0.5),
        ("2025-06-15T15:06:40", T0),  # UTC unless it names a zone
        ("2025-06-15T17:06:40+02:00", T0),
        ("2025-06-15 15:06:40Z", T0),
        ("90s", 2e9 - 90),
        ("30m", 2e9 - 1800),
        ("24h", 2e9 - 86400),
        ("24 h", 2e9 - 86400),
        ("7d", 2e9 - 7 * 86400),
        ("2w", 2e9 - 14 * 86400),
        ("1.5h", 2e9 - 5400),
        ("24", 24.0),  # a bare number is Unix seconds (1970) in every command, never hours
    ],
)
def test_time_forms(text: str, expected: float) -> None:
    assert parse_time(text).at(2e9) == expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "yesterday", "-5", "nan", "inf", "1e999", "24x", "h", "-3h", "11y", "3651d", "1" * (MAX_TIME_CHARS + 1)],
)
def test_bad_times_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a time|years back"):
        parse_time(text)


def test_the_age_limit_is_named() -> None:
    days = int(MAX_AGE_S // 86400)
    assert parse_time(f"{days}d").at(MAX_AGE_S) == 0.0
    with pytest.raises(ValueError, match="years back"):
        parse_time(f"{days + 1}d")


# -- the commands ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_since_and_until_mean_the_same_in_export_and_report(store_dir: Path) -> None:
    """One window in three spellings; the export holds its requests, the report names it."""
    spellings = [
        ("2025-06-15T12:00:00", "2025-06-15T18:00:00"),
        ("2025-06-15T14:00:00+02:00", "2025-06-15T20:00:00+02:00"),
        (str(T0 - 3 * 3600 - 400), str(T0 + 3 * 3600 - 400)),  # 12:00:00 and 18:00:00 in Unix seconds
    ]
    for since, until in spellings:
        export = _run("-m", "store", "export", "--data", str(store_dir), "--since", since, "--until", until)
        assert export.returncode == ExitCode.OK, export.stderr
        assert [json.loads(line)["id"] for line in export.stdout.splitlines()] == ["a", "b"]
        report = _run("-m", "pages.report", "--data", str(store_dir), "--since", since, "--until", until)
        assert report.returncode == ExitCode.OK, report.stderr
        assert "the last 6 h to 2025-06-15 18:00 UTC" in report.stdout.splitlines()[0]
        assert "Requests: 2 finished" in report.stdout


@pytest.mark.slow
def test_one_help_text_and_one_refusal_for_a_bad_time(store_dir: Path) -> None:
    for name, argv in (("store export", ["-m", "store", "export"]), ("pages.report", ["-m", "pages.report"])):
        helped = _run(*argv, "--help")
        assert helped.returncode == ExitCode.OK and TIME_HELP in helped.stdout, name
        for option in ("--since", "--until"):
            bad = _run(*argv, "--data", str(store_dir), option, "yesterday")
            assert bad.returncode == ExitCode.USAGE, (name, bad.stderr)
            assert f"argument {option}: 'yesterday' is not a time: give {TIME_HELP}" in bad.stderr, (name, bad.stderr)


@pytest.mark.slow
def test_a_window_that_ends_before_it_starts_is_a_usage_error(store_dir: Path) -> None:
    bad = _run("-m", "pages.report", "--data", str(store_dir), "--since", str(T0), "--until", str(T0 - 1))
    assert bad.returncode == ExitCode.USAGE and "--since" in bad.stderr


@pytest.mark.slow
def test_no_store_is_a_usage_error_in_every_command(tmp_path: Path) -> None:
    for name, argv in STORE_COMMANDS.items():
        done = _run(*argv, str(tmp_path))
        assert done.returncode == ExitCode.USAGE, (name, done.returncode, done.stderr)
        assert "no " in done.stderr and "store" in done.stderr, (name, done.stderr)


@pytest.mark.slow
def test_a_data_folder_a_collector_holds_is_busy_in_every_command(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    with collector(tmp_path, "--ollama", "127.0.0.1:9") as held:
        for name, argv in {
            "collectors": ["-m", "collectors", "--data", str(tmp_path), "--ollama", "127.0.0.1:9", "--listen", "127.0.0.1:0"],
            "collectors.import_log": ["-m", "collectors.import_log", "--data", str(tmp_path), "--quiet", str(log)],
            "store import-log": ["-m", "store", "import-log", "--data", str(tmp_path), "--quiet", str(log)],
            "collectors.demo": ["-m", "collectors.demo", "--data", str(tmp_path), "--no-traffic"],
        }.items():
            done = _run(*argv)
            assert done.returncode == ExitCode.BUSY, (name, done.returncode, done.stderr)
            assert str(held.pid) in done.stderr, (name, done.stderr)
        assert held.poll() is None


# -- guards: what keeps the above true for a command added later ----------------------------------------------------


def _product_trees() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for package in PRODUCT_PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def test_only_the_shared_module_declares_since_or_until() -> None:
    declared = []
    for path, tree in _product_trees():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and any(isinstance(a, ast.Constant) and a.value in ("--since", "--until") for a in node.args)
            ):
                declared.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert declared and all(d.startswith("analysis/command_line.py:") for d in declared), declared


def _called(call: ast.Call) -> str:
    return str(getattr(call.func, "id", getattr(call.func, "attr", "")))


def test_no_command_returns_a_bare_exit_number() -> None:
    """main() returns an ExitCode member, so a number's meaning is read in one place."""
    bare = []
    for path, tree in _product_trees():
        for func in ast.walk(tree):
            if not (isinstance(func, ast.FunctionDef) and func.name in ("main", "_main", "run_demo", "_stop", "_error")):
                continue
            for node in ast.walk(func):
                value = node.value if isinstance(node, ast.Return) else None
                if isinstance(node, ast.Call) and _called(node) in ("exit", "SystemExit"):
                    value = node.args[0] if node.args else None
                if isinstance(value, ast.Constant) and isinstance(value.value, int):
                    bare.append(f"{path.relative_to(REPO)}:{value.lineno} {func.name}")
    assert bare == [], f"return an analysis.command_line.ExitCode member: {bare}"


def test_the_exit_code_table_in_the_docs_is_the_enum() -> None:
    text = (REPO / "docs/settings.md").read_text(encoding="utf-8")
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\d+)` \| (\w+) \|", section, flags=re.MULTILINE)
    assert rows == [(str(int(code)), code.name) for code in ExitCode]


@pytest.mark.slow
def test_the_why_command_reads_its_end_time_in_the_same_forms(store_dir: Path) -> None:
    outputs = []
    for now in ("2025-06-15T18:00:00", "2025-06-15T20:00:00+02:00", str(T0 + 3 * 3600 - 400)):
        done = _run("-m", "pages.why", "--json", "--data", str(store_dir), "--window-s", "21600", "--now", now)
        assert done.returncode == ExitCode.OK, (now, done.stderr)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].strip().startswith("{")
    bad = _run("-m", "pages.why", "--json", "--data", str(store_dir), "--now", "yesterday")
    assert bad.returncode == ExitCode.USAGE and f"'yesterday' is not a time: give {TIME_HELP}" in bad.stderr
