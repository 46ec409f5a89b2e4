"""Discovery against what any local user can start (issue 29, finding 3): a process named ``ollama`` with the
command line ``ollama serve``, listening on the watched port number on another loopback address (127.0.0.2),
with a child ``llama-server --port P --model .../sha256-<the loaded model's digest>``. Real processes on
loopback; the three-user case runs Ollama, the collector and the fake as three OS users, none root.

Also here: a model path that is no regular file (a FIFO, ``/dev/zero``, a huge sparse file) is never read, and
discovery never holds the collector's exit."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.ollama.discovery import FOUND_OTHER_USER, MAX_HASHED_BYTES, DigestCache, discover
from collectors.ollama.runner_slots import read_once
from tests.support.fake_ollama import discovery_cli_as, fake_ollama
from tests.support.os_users import ensure_user, require_root
from tests.support.ports import free_port
from tests.support.runner_process import REPO_ROOT, OllamaStandIn, ps_entry, start_bad_runner

MODEL = "gemma3:270m"
DIGEST = "ab" * 32
OLLAMA_USER, DESK_USER, MALLORY_USER = "pw_ollama", "pw_desk", "pw_mallory"
BLOB = f"/usr/share/ollama/.ollama/models/blobs/sha256-{DIGEST}"  # the digest comes from the name: never opened
STALL_LIMIT_S = 30.0  # a read that never ends is cut off here; the fixed code answers in well under a second


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / f"sha256-{DIGEST}"
    path.write_bytes(b"GGUF")
    return path


def test_a_fake_ollama_on_another_loopback_address_is_not_adopted(model_file: Path) -> None:
    """Same user as the collector (its sockets readable): the port number alone no longer makes it Ollama."""
    with (
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("good", model_file) as real,
        fake_ollama("127.0.0.2", ollama.port, model_path=str(model_file), digest=f"sha256:{DIGEST}") as fake,
    ):
        found = discover(ollama.base_url)
        printed = read_once(ollama.base_url)
        of_the_fake = discover(f"http://127.0.0.2:{ollama.port}")
    assert [r.pid for r in found.runners] == [real.proc.pid], found
    assert [r["pid"] for r in printed["runners"]] == [real.proc.pid]
    assert [r.pid for r in of_the_fake.runners] == [fake.runner_pid], "watched there, it is that address's runner"


@pytest.fixture(scope="module")
def three_users() -> None:
    require_root()
    for user in (OLLAMA_USER, DESK_USER, MALLORY_USER):
        ensure_user(user)


@pytest.mark.slow
def test_a_fake_ollama_of_a_third_user_is_not_adopted(three_users: None) -> None:
    """Ollama as pw_ollama on 127.0.0.1:P, the fake as pw_mallory on 127.0.0.2:P, the collector as pw_desk (who
    reads neither's sockets per process, only the system-wide table): only Ollama's runner is adopted. Root,
    who reads every process's sockets, adopts only it too."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        fake_ollama("127.0.0.1", port, model_path=BLOB, digest=f"sha256:{DIGEST}", user=OLLAMA_USER) as real,
        fake_ollama("127.0.0.2", port, model_path=BLOB, digest=f"sha256:{DIGEST}", user=MALLORY_USER) as fake,
    ):
        as_desk = discovery_cli_as(DESK_USER, url)
        as_root = discover(url)
        fake_pid = fake.runner_pid
    assert as_desk["found_by"] == FOUND_OTHER_USER, as_desk
    runners = as_desk["runners"]
    assert isinstance(runners, list) and [r["pid"] for r in runners] == [real.runner_pid], as_desk
    assert fake_pid not in [r.pid for r in as_root.runners]
    assert [r.pid for r in as_root.runners] == [real.runner_pid], as_root


# -- the model file --------------------------------------------------------------------------


def _digest_in_a_child(path: str) -> tuple[str, float]:
    """DigestCache().digest(path) in a child process (a stalled read cannot be stopped in a thread): (what it
    printed, seconds)."""
    code = "import sys; from collectors.ollama.discovery import DigestCache; print(DigestCache().digest(sys.argv[1]))"
    started = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, path], cwd=REPO_ROOT, capture_output=True, text=True, timeout=STALL_LIMIT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hashing {path} did not end within {STALL_LIMIT_S:g} s")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), time.monotonic() - started


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse"])
def test_a_model_path_that_is_no_regular_file_is_never_read(tmp_path: Path, kind: str) -> None:
    """A FIFO stalled discovery for good, /dev/zero kept a core busy for ever, a sparse file past the cap
    would cost minutes: none is read (the model stays unknown, said as no digest)."""
    if kind == "fifo":
        path = tmp_path / "model.gguf"
        os.mkfifo(path)
    elif kind == "dev_zero":
        path = Path("/dev/zero")
    else:
        path = tmp_path / "huge.gguf"
        with open(path, "wb") as f:
            f.truncate(MAX_HASHED_BYTES + 1)  # sparse: no disk used
    printed, took_s = _digest_in_a_child(str(path))
    assert printed == "None", printed
    assert took_s < STALL_LIMIT_S


def test_a_regular_model_file_is_still_hashed_once(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(3 << 20))
    cache = DigestCache()
    assert cache.digest(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert cache.digest(str(tmp_path / f"sha256-{DIGEST}")) == DIGEST  # a blob name: not even opened


# -- shutdown --------------------------------------------------------------------------------

STUCK_DISCOVERY = """
import asyncio, threading, aiohttp
from collectors.ollama.runners import RunnerReader

async def main():
    async with aiohttp.ClientSession() as session:
        reader = RunnerReader("http://127.0.0.1:9", session, in_flight=list, loaded_models=list,
                              discover=lambda url: threading.Event().wait())  # a read that never returns
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 10)

asyncio.run(main())
print("stopped", flush=True)
"""


def test_a_discovery_that_never_returns_does_not_hold_the_exit() -> None:
    started = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", STUCK_DISCOVERY], cwd=REPO_ROOT, capture_output=True, text=True, timeout=STALL_LIMIT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reader's loop did not exit within {STALL_LIMIT_S:g} s while discovery was stuck")
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr
    assert time.monotonic() - started < STALL_LIMIT_S


@pytest.mark.slow
def test_the_collector_stops_on_sigterm_beside_a_fifo_model(tmp_path: Path) -> None:
    """Issue 29's case end to end: a runner whose --model is a FIFO; ``python -m collectors`` finds it, runs on,
    and exits on SIGTERM at once."""
    from tests.support.collector_process import collector

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    data = tmp_path / "data"
    with (
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("good", fifo) as child,
        collector(data, "--ollama", ollama.base_url) as proc,
    ):
        time.sleep(4.0)  # discovery has run (it starts at once)
        assert proc.poll() is None, "the collector runs on"
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            _out, err = proc.communicate(timeout=STALL_LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the collector did not exit within {STALL_LIMIT_S:g} s of SIGTERM")
        took_s = time.monotonic() - started
    assert proc.returncode == 0 and took_s < STALL_LIMIT_S
    assert f"pid {child.proc.pid} port {child.port}" in err, "the runner was found"
    assert "Traceback" not in err
