"""Which program sent each request, through the proxy in front of sim: two programs on this machine told apart.

The official ``ollama`` client in this process and a second process (Python's urllib with a User-Agent of its
own) send to the same proxy from the same address: each record names its program (the User-Agent's first product
and version) and its local process (name, pid, user), as the OS's table of connections shows them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.metadata import version

import ollama
import psutil
import pytest

from analysis.records import RequestRecord
from collectors.os_users import user_name
from tests.support.proxy_thread import ProxyThread
from tests.support.record_checks import MODEL
from tests.support.sim_process import SimProcess

# The "cpu" profile makes each request last ~0.6 s: a client on this machine keeps its socket open that long, far
# longer than the scan of the OS's connections takes even on a busy machine (a socket closed before the scan has no
# process left to name).
pytestmark = pytest.mark.sim_args("--hardware", "cpu")

BOT_AGENT = "report-bot/2.1 (nightly; +https://example.invalid)"
# A second program: its own User-Agent, its own process. It prints its pid, then sends one request.
_BOT = """
import json, os, sys, urllib.request
print(os.getpid(), flush=True)
body = json.dumps({"model": sys.argv[2], "prompt": "hi from the bot", "stream": False, "options": {"num_predict": 64}})
req = urllib.request.Request(sys.argv[1] + "/api/generate", data=body.encode(), headers={"User-Agent": sys.argv[3]})
with urllib.request.urlopen(req, timeout=60) as r:
    r.read()
"""


def _by_program(proxy: ProxyThread, program: str) -> RequestRecord:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for rec in list(proxy.records):
            if rec.client_program == program:
                return rec
        time.sleep(0.02)
    raise AssertionError(f"no record from {program}: {[r.client_program for r in proxy.records]}")


def test_two_programs_on_one_machine_told_apart(sim: SimProcess, proxy: ProxyThread) -> None:
    ollama.Client(host=proxy.base_url, timeout=60).generate(model=MODEL, prompt="hi", options={"num_predict": 64})
    bot = subprocess.run(
        [sys.executable, "-c", _BOT, proxy.base_url, MODEL, BOT_AGENT], capture_output=True, text=True, timeout=60
    )
    assert bot.returncode == 0, bot.stderr
    bot_pid = int(bot.stdout.split()[0])

    mine = _by_program(proxy, "ollama-python")
    theirs = _by_program(proxy, "report-bot")
    assert mine.client_program_version == version("ollama")
    assert theirs.client_program_version == "2.1"  # the comment after the product is never kept
    assert mine.client_addr == theirs.client_addr == "127.0.0.1"  # the address alone cannot tell them apart
    me = psutil.Process()
    assert (mine.client_pid, mine.client_process, mine.client_user) == (os.getpid(), me.name(), user_name(os.getuid()))
    # Read while the bot ran (it has exited since): the same interpreter's name, its own pid.
    assert (theirs.client_pid, theirs.client_process, theirs.client_user) == (bot_pid, me.name(), user_name(os.getuid()))


def test_no_user_agent_is_unknown(sim: SimProcess, proxy: ProxyThread) -> None:
    """A raw request without a User-Agent: the program is unknown (None), never ""; the process is still found."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.base_url.rsplit(":", 1)[1]), timeout=60)
    body = json.dumps({"model": MODEL, "prompt": "no agent", "stream": False, "options": {"num_predict": 64}})
    conn.putrequest("POST", "/api/generate", skip_accept_encoding=True)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body.encode())
    conn.getresponse().read()
    conn.close()
    deadline = time.monotonic() + 30
    while not [r for r in proxy.records if r.client_program is None]:
        assert time.monotonic() < deadline, [r.client_program for r in proxy.records]
        time.sleep(0.02)
    rec = next(r for r in proxy.records if r.client_program is None)
    assert rec.client_program_version is None
    assert rec.client_pid == os.getpid()
