"""sim writes Ollama's log as Ollama does: one access line per request, on stdout and in ``--log-file``, in the
format the collector's log reader parses (``collectors.ollama.log``): status, latency, client, method, path.
(With ``--engine llama-server`` the runner's lines and the load lines join them: tests/collectors/ollama/
test_direct_engine.py reads that log.)"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from pathlib import Path

from collectors.ollama.log import parse_line
from sim.ollama_log import go_quote, strconv_quote
from tests.support.sim_process import start_sim


def test_access_lines_go_to_stdout_and_the_log_file_and_parse(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "server.log"
    with start_sim("--log-file", str(log_file)) as sim:
        body = json.dumps({"model": "qwen2.5:0.5b", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}).encode()
        req = urllib.request.Request(sim.base_url + "/api/generate", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
        deadline = time.monotonic() + 10
        while '"/api/generate"' not in (log_file.read_text() if log_file.exists() else ""):
            assert time.monotonic() < deadline, "no access line in the log file"
            time.sleep(0.05)
        file_lines = log_file.read_text().splitlines()
        stdout = sim.log()
    generate = [
        e
        for line in file_lines
        if (e := parse_line(line, 0.0)) is not None and e.access is not None and e.access.path == "/api/generate"
    ]
    assert len(generate) == 1
    access = generate[0].access
    assert access is not None
    assert (access.status, access.client, access.method) == (200, "127.0.0.1", "POST")
    assert 0 < access.latency_s < 60 and abs(access.ended_unix_s - time.time()) < 60
    assert all(line in stdout for line in file_lines)  # the same lines on stdout, as a service's output


def test_slog_values_arego_quoted_as_gogo_quotes_them() -> None:
    assert go_quote("plain") == "plain"
    assert go_quote('/bin/llama-server --model "a b"') == '"/bin/llama-server --model \\"a b\\""'


def test_the_access_line_quotes_the_path_as_gin_does(tmp_path: Path) -> None:
    """gin prints the path with %#v (Go's strconv.Quote) and the raw query after it: a quote or a newline in the path
    stays escaped on one line, as in Ollama's own log, so tests against sim read a log as strict as Ollama's."""
    log_file = tmp_path / "server.log"
    with start_sim("--log-file", str(log_file)) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
        conn.request("POST", "/api/x%22y%0Az%5C?q=a%20b", body=b"{}", headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 404
        conn.close()
        deadline = time.monotonic() + 10
        while "/api/x" not in (log_file.read_text() if log_file.exists() else ""):
            assert time.monotonic() < deadline, "no access line in the log file"
            time.sleep(0.05)
    (line,) = [line for line in log_file.read_text().splitlines() if "/api/x" in line]
    assert line.endswith(' | POST     "/api/x\\"y\\nz\\\\?q=a%20b"'), line


def test_strconv_quote_escapes_as_go_does() -> None:
    assert strconv_quote("/api/chat") == '"/api/chat"'
    assert strconv_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert strconv_quote("a\nb\tc\x00\x7f") == '"a\\nb\\tc\\x00\\x7f"'
    assert strconv_quote("é☃\u200b\U0001f600") == '"é☃\\u200b😀"'  # printable runes stay; a zero-width space does not
    assert strconv_quote(b"\xff".decode("utf-8", "surrogateescape")) == '"\\xff"'
