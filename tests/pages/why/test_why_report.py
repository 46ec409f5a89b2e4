"""``python -m pages.report`` over the Why page's fixture store, with text recorded, a client on another machine,
reloads by options and a 503 at OLLAMA_MAX_QUEUE: the report names the version, the GPU, the rates against their
ceilings, the loads with their cause and the flags with their fixes, and nothing that identifies the user."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from analysis.records import Outcome
from bench.pages_fixture import Shape, make_request
from pages.why.report import build_report
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.why_page import MODEL, build_store, open_why

SECRET_PROMPT = "my bank password is hunter2"
SECRET_REPLY = "noted: hunter2"
REMOTE = "203.0.113.7"  # a client on another machine (TEST-NET-3)


def _write_extras(data_dir: Path, now: float) -> None:
    t0 = now - 600
    recs = []
    # Two clients alternating num_ctx: each request loads the model again (1.5 s).
    for i, ctx in enumerate([2048, 4096, 2048, 4096, 2048]):
        rec = make_request(
            now - 500 + 20 * i,
            t0,
            model="qwen2.5:0.5b",
            shape=Shape(load_ms=1500),
            prompt_text=SECRET_PROMPT,
            response_text=SECRET_REPLY,
        )
        rec.num_ctx = ctx
        rec.client_addr = f"{'127.0.0.1' if i % 2 == 0 else REMOTE}:{50000 + i}"
        recs.append(rec)
    busy = make_request(now - 300, t0, model="qwen2.5:0.5b", outcome=Outcome.HTTP_ERROR)
    busy = dataclasses.replace(
        busy,
        status_code=503,
        metrics=None,
        error="upstream HTTP 503: server busy, please try again.  maximum pending requests exceeded",
        client_addr=f"{REMOTE}:40000",
    )
    recs.append(busy)
    w_ = StoreWriter(db_path(data_dir))
    try:
        w_.apply([PutRequest(r) for r in recs])
    finally:
        w_.close()


def test_report_diagnoses_without_identifying_the_user(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now)
    _write_extras(data_dir, now)

    out = subprocess.run(
        [sys.executable, "-m", "pages.report", "--data", str(data_dir), "--since", "24h"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert (
        out == build_report(data_dir, since_s=24 * 3600.0)
        or out.splitlines()[1:] == (build_report(data_dir, since_s=24 * 3600.0) or "").splitlines()[1:]
    )  # the first line carries the minute it was made

    assert f"data folder {data_dir.name!r}" in out
    assert "Ollama: version" in out
    assert "GPU: NVIDIA GeForce RTX 4090" in out
    assert re.search(rf"{re.escape(MODEL)}: \d+ requests; .*decode median .* tok/s of a .* tok/s ceiling", out), out
    assert "options changed (num_ctx 2,048 → 4,096) by a client on another machine" in out
    assert "options changed (num_ctx 4,096 → 2,048) by 127.0.0.1" in out
    assert re.search(r"reload_churn × 1: qwen2\.5:0\.5b was loaded 4 times within an hour .*Fix: send the same num_ctx", out)
    assert "queue_full × 1: Ollama answered 503" in out and "Fix: raise OLLAMA_MAX_QUEUE" in out

    # Nothing that identifies the user: no text, no address beyond loopback, no path but the folder's name.
    for secret in (SECRET_PROMPT, SECRET_REPLY, "hunter2", REMOTE):
        assert secret not in out
    assert str(data_dir.parent) not in out and os.path.expanduser("~") not in out
    paths = set(re.findall(r"(?:^|[\s(])(/[^\s,;)]+)", out, flags=re.MULTILINE))
    assert paths <= {"/api/ps"}, paths
    addresses = set(re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", out))
    assert addresses and all(a.startswith("127.") for a in addresses), addresses


def test_report_without_a_store_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pages.report", "--data", str(tmp_path / "nothing-here")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no store" in done.stderr and str(tmp_path) not in done.stderr  # usage: no store there


def test_why_page_offers_the_report_as_a_block_to_copy(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now)
    _write_extras(data_dir, now)
    at = open_why()
    assert not [c for c in at.code if c.value.startswith("Phasewatch report: ")]  # made on demand only
    at.toggle(key="why_report").set_value(True).run()
    (block,) = [c for c in at.code if c.value.startswith("Phasewatch report: ")]
    report = build_report(data_dir, since_s=24 * 3600.0) or ""
    assert block.value.splitlines()[1:] == report.splitlines()[1:]  # the first line carries the minute it was made
    assert "reload_churn × 1" in block.value and SECRET_PROMPT not in block.value and REMOTE not in block.value
