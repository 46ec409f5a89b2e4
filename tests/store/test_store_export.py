"""``python -m store export``: one row per request with the phase keys of ``analysis.phases``."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.command_line import parse_time
from analysis.phases import CLI_KEYS, split_record
from store import queries
from store.__main__ import main as store_main
from store.export import EXPORT_KEYS, csv_cell, write_csv
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.records import FORMULA_MODELS, make_record

T0 = 1_750_000_000.0


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store", "export", *args], capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    w = StoreWriter(db_path(tmp_path))
    w.apply(
        [
            PutRequest(r)
            for r in [make_record("a", T0), make_record("b", T0 + 3600, n_tokens=1), make_record("c", T0 + 7200, final=False)]
        ]
    )
    w.close()
    return tmp_path


def test_jsonl_has_the_phase_keys_and_their_values(data_dir: Path) -> None:
    proc = _export("--data", str(data_dir), "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    required = {"id", "model", "endpoint", "status", "started_at", "ttft_s", "itl_p50_ms", "itl_p99_ms", "itl_max_ms"}
    assert required | set(CLI_KEYS) <= set(rows[0])
    a = split_record(make_record("a", T0))
    for key in ("total_s", "queue_s", "prefill_tok_s", "decode_tok_s", "ollama_prefill_tok_s", "ttft_s", "itl_p99_ms"):
        assert rows[0][key] == pytest.approx(getattr(a, key)), key
    assert rows[0]["started_at"] == "2025-06-15T15:06:40.000+00:00"
    assert rows[0]["status"] == "ok" and rows[0]["flags"] == ["cache_hit"]
    assert rows[1]["decode_tok_s"] is None and "one_token_reply" in rows[1]["flags"]
    assert rows[2]["status"] == "in_flight" and rows[2]["flags"] == ["missing_metrics"]


def test_csv_to_a_file_with_since(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    proc = _export("--data", str(data_dir), "--format", "csv", "--since", str(T0 + 1), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 requests" in proc.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["id"] for r in rows] == ["b", "c"]
    assert json.loads(rows[0]["flags"])[0] in {"cache_hit", "one_token_reply"}
    assert rows[1]["decode_tok_s"] == ""  # absent, not zero


def test_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    proc = _export("--data", str(tmp_path), "--format", "csv")
    assert proc.returncode == 2
    assert "no Phasewatch store" in proc.stderr and proc.stdout == ""
    proc = _export("--data", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "not a folder" in proc.stderr


def test_bad_since_is_a_clear_error(data_dir: Path) -> None:
    proc = _export("--data", str(data_dir), "--since", "yesterday-ish")
    assert proc.returncode == 2 and "--since" in proc.stderr


def test_parse_since_forms() -> None:
    now = 2_000_000_000.0
    assert parse_time("24h").at(now) == now - 86400
    assert parse_time("30m").at(now) == now - 1800
    assert parse_time("1700000000").at(now) == 1_700_000_000.0
    assert parse_time("2025-06-15T15:06:40").at(now) == T0  # UTC unless it says otherwise
    assert parse_time("2025-06-15T17:06:40+02:00").at(now) == T0


def test_empty_store_exports_a_header_only(tmp_path: Path) -> None:
    StoreWriter(db_path(tmp_path)).close()
    proc = _export("--data", str(tmp_path), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [",".join(EXPORT_KEYS)]


@pytest.fixture
def formula_dir(tmp_path: Path) -> Path:
    w = StoreWriter(db_path(tmp_path))
    w.apply([PutRequest(make_record(f"f{i}", T0 + i, model=m)) for i, m in enumerate([*FORMULA_MODELS, "llama3.2"])])
    w.close()
    return tmp_path


def test_csv_export_escapes_formula_cells_and_keeps_numbers(formula_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    proc = _export("--data", str(formula_dir), "--format", "csv", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:  # the CR inside a cell stays a CR
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == [*("'" + m for m in FORMULA_MODELS), "llama3.2"]
    for r in rows:
        assert float(r["ttft_s"]) == pytest.approx(0.2)  # numbers stay numbers, unprefixed
        assert float(r["started_at_unix_s"]) >= T0
    # JSON lines are data, not a spreadsheet: the names stay as recorded.
    proc = _export("--data", str(formula_dir), "--format", "jsonl")
    assert [json.loads(line)["model"] for line in proc.stdout.splitlines()] == [*FORMULA_MODELS, "llama3.2"]


def test_csv_cell_escapes_text_only() -> None:
    assert csv_cell("=1+1") == "'=1+1" and csv_cell("-x") == "'-x" and csv_cell("\r=1") == "'\r=1"
    assert csv_cell("llama3.2") == "llama3.2" and csv_cell("") == "" and csv_cell("a=b") == "a=b"
    assert csv_cell(-1.5) == -1.5 and csv_cell(-3) == -3 and csv_cell(None) is None  # negative numbers are numbers
    out = io.StringIO()
    write_csv(iter([{"id": "-1", "model": "=x", "transport_s": -0.004, "token_chunks": -1}]), out)
    row = next(csv.DictReader(io.StringIO(out.getvalue())))
    assert (row["id"], row["model"], row["transport_s"], row["token_chunks"]) == ("'-1", "'=x", "-0.004", "-1")


def test_export_reads_a_wal_store_on_read_only_media(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = sqlite3.connect(db_path(data_dir))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # a WAL store
    conn.close()
    # Read-only media, emulated (tests run as root, whom chmod does not stop): the -shm file cannot be
    # created (its name is a link into a folder that does not exist), and the folder reports itself not writable.
    Path(f"{db_path(data_dir)}-shm").symlink_to(tmp_path / "no-such-folder" / "shm")
    monkeypatch.setattr(queries, "folder_writable", lambda folder: False)

    assert store_main(["export", "--data", str(data_dir), "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    a = split_record(make_record("a", T0))
    assert rows[0]["decode_tok_s"] == pytest.approx(a.decode_tok_s) and rows[2]["status"] == "in_flight"


# Issue 25 #9: ASVS lists NUL too (LibreOffice Calc drops a leading NUL and runs "\x00=1+1" as 2), and a formula
# sign after leading whitespace or control characters is still a formula to a spreadsheet that trims them.
HIDDEN_FORMULAS = [
    "\x00=1+1",
    '\x00=HYPERLINK("http://x","c")',
    "\x00",
    "\x00\x00@x",
    " =1+1",
    "\n+1",
    "\u00a0-1+2",
    "\x00 \t@SUM(A1)",
    "\x0b=1",
]


def test_csv_cell_escapes_a_leading_nul_and_formulas_after_blanks() -> None:
    for text in HIDDEN_FORMULAS:
        assert csv_cell(text) == "'" + text, repr(text)
    for text in ("a\x00=1", "llama3.2 =x", " llama", "1-2"):  # a formula sign later on is text
        assert csv_cell(text) == text, repr(text)


def test_csv_export_escapes_nul_and_blank_led_formulas_from_the_store(tmp_path: Path) -> None:
    w = StoreWriter(db_path(tmp_path))
    w.apply([PutRequest(make_record(f"n{i}", T0 + i, model=m)) for i, m in enumerate(HIDDEN_FORMULAS)])
    w.close()
    out = tmp_path / "out.csv"
    proc = _export("--data", str(tmp_path), "--format", "csv", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["'" + m for m in HIDDEN_FORMULAS]
