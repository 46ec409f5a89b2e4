"""``python -m pages.report`` after an API client chose hostile model names (issue 39 F13): requests sent through
the real proxy to sim, each answered 404 with the name echoed, recorded in a real store. The report holds no
control byte, no line of the client's making, no address but loopback and no path; the model Ollama served is
still named, and the client-chosen names are counted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO
from tests.support.proxy_thread import ProxyThread

SERVED = "qwen2.5:0.5b"  # a model sim has: answered 200
FORGED_BLOCK = "Requests: 0 finished, from 0 client addresses\nFlags seen:\n  none"
HOSTILE = (
    "\x1b[2J\x1b[Hwiped",  # clear the screen, cursor home
    f"x\n{FORGED_BLOCK}",  # a forged block of report lines
    "\r\x1b[31mred",  # back to the line's start, red
    "192.168.7.42",  # an address on the user's network
    "/home/alice/.ssh/id_rsa",  # a path in a home folder
    "m\x07\x08\x7f\u009b31m\u202eevil",  # BEL, BS, DEL, a C1 CSI, a right-to-left override
)
# Any character a terminal acts on: C0 but LF, DEL, C1, line/paragraph separators, bidirectional controls.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _post(base_url: str, body: dict[str, object]) -> int:
    req = urllib.request.Request(
        base_url + "/api/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def test_the_report_after_hostile_model_names(proxy: ProxyThread, data_dir: Path) -> None:
    statuses = [_post(proxy.base_url, {"model": name, "prompt": "hi", "stream": False}) for name in HOSTILE]
    assert statuses == [404] * len(HOSTILE)
    ok = {"model": SERVED, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
    assert _post(proxy.base_url, ok) == 200
    records = proxy.wait_records(len(HOSTILE) + 1)
    assert {r.model for r in records} == {*HOSTILE, SERVED}  # recorded as the client sent them
    writer = StoreWriter(db_path(data_dir))
    try:
        writer.apply([PutRequest(r) for r in records])
    finally:
        writer.close()

    out = subprocess.run(
        [sys.executable, "-m", "pages.report", "--data", str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout

    assert not CONTROL.findall(out), [line for line in out.splitlines() if CONTROL.search(line)]
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("Requests:")] == [
        f"Requests: {len(records)} finished, from 1 client address: 127.0.0.1; by program (User-Agent): Python-urllib × "
        f"{len(records)}"
    ]
    assert sum(line == "Flags seen:" for line in lines) == 1 and "  none" not in lines
    assert "192.168.7.42" not in out and "/home" not in out and "alice" not in out
    addresses = set(re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", out))
    assert addresses == {"127.0.0.1"}, addresses
    assert any(line.startswith(f"  {SERVED}: 1 request;") for line in lines), out
    assert f"  {len(HOSTILE)} other names in {len(HOSTILE)} requests, not shown" in out
