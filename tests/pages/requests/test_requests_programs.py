"""Two programs on one machine told apart: the official ``ollama`` client (this process) and a second program with a
User-Agent of its own (Python's urllib in another process), both through the proxy in front of sim, from the same
address. Their records, written with the collector's StoreWriter, name each program and its process on the Requests
page (a column, and a filter that keeps one), in the CSV export and in the usage totals per program.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import ollama
import pytest
from streamlit.testing.v1 import AppTest

from pages.requests.usage import UNKNOWN_PROGRAM, load_usage, usage_frame
from pages.why.report import build_report
from store import queries
from store.export import ExportWindow, csv_text
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.proxy_thread import ProxyThread
from tests.support.record_checks import MODEL
from tests.support.sim_process import SimProcess

# Each request lasts ~0.6 s on the "cpu" profile: its socket is open while the collector looks its process up.
pytestmark = [pytest.mark.sim_args("--hardware", "cpu"), pytest.mark.slow]

BOT = "report-bot/2.1 (nightly)"
_BOT = """
import json, os, sys, urllib.request
print(os.getpid(), flush=True)
body = json.dumps({"model": sys.argv[2], "prompt": "hi from the bot", "stream": False, "options": {"num_predict": 64}})
req = urllib.request.Request(sys.argv[1] + "/api/generate", data=body.encode(), headers={"User-Agent": sys.argv[3]})
with urllib.request.urlopen(req, timeout=60) as r:
    r.read()
"""


@pytest.fixture(scope="module")
def recorded(sim: SimProcess, proxy: ProxyThread, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A data folder holding the two programs' requests (two from the ollama client, one from the bot); the bot's pid."""
    client = ollama.Client(host=proxy.base_url, timeout=60)
    for prompt in ("hi", "hi again"):
        client.generate(model=MODEL, prompt=prompt, options={"num_predict": 64})
    bot = subprocess.run([sys.executable, "-c", _BOT, proxy.base_url, MODEL, BOT], capture_output=True, text=True, timeout=60)
    assert bot.returncode == 0, bot.stderr
    records = proxy.wait_records(3)
    data = tmp_path_factory.mktemp("programs")
    w = StoreWriter(db_path(data))
    for rec in records:
        w.write(PutRequest(rec))
    w.close()
    return data, int(bot.stdout.split()[0])


def test_export_names_each_program_and_process(recorded: tuple[Path, int]) -> None:
    data, bot_pid = recorded
    with queries.open_reader(db_path(data)) as conn:
        rows = list(csv.DictReader(io.StringIO(csv_text(conn, ExportWindow()))))
    by_program = {(r["client_program"], r["client_program_version"], r["client_pid"]) for r in rows}
    assert by_program == {("ollama-python", version("ollama"), str(os.getpid())), ("report-bot", "2.1", str(bot_pid))}
    assert {r["client_addr"] for r in rows} == {"127.0.0.1"}  # one address: only the program tells them apart
    with queries.open_reader(db_path(data)) as conn:
        only_bot = list(csv.DictReader(io.StringIO(csv_text(conn, ExportWindow(program="report-bot")))))
    assert [r["client_program"] for r in only_bot] == ["report-bot"]  # the page's filter, in its download too
    cli = subprocess.run(
        [sys.executable, "-m", "store", "export", "--data", str(data), "--format", "csv", "--program", "ollama-python"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert [r["client_program"] for r in csv.DictReader(io.StringIO(cli))] == ["ollama-python"] * 2


def test_usage_per_program(recorded: tuple[Path, int]) -> None:
    data, _ = recorded
    rows = load_usage(db_path(data), time.time()) or []
    per_program = {r.key: r for r in rows if r.by == "program" and r.period == "1 day"}
    assert {k: r.requests for k, r in per_program.items()} == {"ollama-python": 2, "report-bot": 1}
    assert UNKNOWN_PROGRAM not in per_program
    mine, theirs = per_program["ollama-python"].output_tokens.value, per_program["report-bot"].output_tokens.value
    assert mine is not None and theirs is not None and mine > theirs > 0  # two replies against one
    # The page's table of it (the page reads usage up to the last whole minute: these requests are newer).
    frame = usage_frame(rows, "program", "1 day")
    assert dict(zip(frame["program"], frame["requests"], strict=True)) == {"ollama-python": 2, "report-bot": 1}


def test_requests_page_column_and_filter(recorded: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    data, bot_pid = recorded
    monkeypatch.setenv("PHASEWATCH_DATA", str(data))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    monkeypatch.delenv("PHASEWATCH_DEMO", raising=False)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe(key="req_table").value
    assert sorted(table["program"]) == sorted([f"ollama-python {version('ollama')}"] * 2 + ["report-bot 2.1"])
    bot_row = table[table["program"] == "report-bot 2.1"].iloc[0]
    assert f"pid {bot_pid}" in bot_row["process"]
    assert set(at.selectbox(key="req_program").options) == {"any", "ollama-python", "report-bot"}
    at.selectbox(key="req_program").select("report-bot").run()
    assert not at.exception, [e.value for e in at.exception]
    assert list(at.dataframe(key="req_table").value["program"]) == ["report-bot 2.1"]


def test_report_names_the_programs(recorded: tuple[Path, int]) -> None:
    data, _ = recorded
    report = build_report(data)
    assert report is not None
    line = next(x for x in report.splitlines() if x.startswith("Requests:"))
    assert line == (
        "Requests: 3 finished, from 1 client address: 127.0.0.1; by program (User-Agent): ollama-python × 2, report-bot × 1"
    )
