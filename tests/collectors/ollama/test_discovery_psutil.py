"""Discovery where /proc/net cannot be read (macOS, Windows): the listening sockets through psutil, a runner named
``llama-server.exe`` taken for what it is (issue 45). Real processes on loopback (tests/support/fake_ollama.py),
discovery run in the stripped Python (tests/support/stripped_python.py) as this same user."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from collectors.ollama.discovery import FOUND_SAME_USER, discover
from tests.support.fake_ollama import fake_ollama
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stripped_python import stripped_env

DIGEST = "cd" * 32
BLOB = f"/tmp/no-such-dir/sha256-{DIGEST}"  # the digest comes from the name: never opened


def stripped_discovery(tmp_path: Path, url: str) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-m", "collectors.ollama", "--ollama", url, "--json"],
        env=stripped_env(tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    found: dict[str, object] = json.loads(run.stdout)
    return found


def test_a_runner_named_llama_server_exe_is_found_through_psutil(tmp_path: Path) -> None:
    """Its own Ollama's, on 127.0.0.1; another tree of the same user on 127.0.0.2 at the same port is not taken."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        fake_ollama("127.0.0.1", port, model_path=BLOB, digest=f"sha256:{DIGEST}", runner_name="llama-server.exe") as real,
        fake_ollama("127.0.0.2", port, model_path=BLOB, digest=f"sha256:{DIGEST}", runner_name="llama-server.exe"),
    ):
        found = stripped_discovery(tmp_path, url)
        here = discover(url)  # this machine's full Python, through /proc/net: the same answer
    assert found["found_by"] == FOUND_SAME_USER, found
    runners = found["runners"]
    assert isinstance(runners, list) and [r["pid"] for r in runners] == [real.runner_pid], found
    assert [r.pid for r in here.runners] == [real.runner_pid], here
