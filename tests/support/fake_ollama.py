"""A process tree that looks like Ollama and its runner to discovery, run as any OS user (issue 29).

    with fake_ollama("127.0.0.2", port, model_path=..., digest=..., user="pw_mallory") as tree:
        tree.runner_pid, tree.runner_port

``fake_ollama_serve.py`` as ``ollama serve`` (through a symlink named ``ollama`` to a Python) listening on
HOST:PORT, with a child ``llama-server --port P --model PATH -np N`` (``slots_server.py``, answering /slots
in ``mode``). Started from a folder of its own that every user can enter; stopped (with its child) after.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.os_users import python_for

SUPPORT = Path(__file__).resolve().parent
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FakeTree:
    proc: subprocess.Popen[bytes]  # "ollama serve"
    runner_pid: int
    runner_port: int


@contextlib.contextmanager
def fake_ollama(
    host: str,
    port: int,
    *,
    model_path: str,
    digest: str,
    mode: str = "good",
    parallel: int = 1,
    location: str = "",
    user: str | None = None,
    runner_name: str = "llama-server",
) -> Iterator[FakeTree]:
    """The tree as ``user`` (None: as this process's user), once its runner answers; its runner's program is named
    ``runner_name`` (``llama-server.exe``: as on Windows)."""
    python = os.path.realpath(python_for(user)[0][0] if user is not None else sys.executable)
    folder = Path(tempfile.mkdtemp(prefix="fake-ollama-"))
    folder.chmod(0o755)  # another user runs from it
    for name in ("ollama", runner_name):
        (folder / name).symlink_to(python)
    shutil.copy(SUPPORT / "fake_ollama_serve.py", folder / "serve")
    shutil.copy(SUPPORT / "slots_server.py", folder / "slots_server.py")
    argv = [str(folder / "ollama"), "serve", "--listen", f"{host}:{port}", "--model", model_path, "--digest", digest]
    argv += ["--mode", mode, "-np", str(parallel), "--location", location, "--runner-name", runner_name]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    as_user: dict[str, object] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, **as_user)  # type: ignore[call-overload]
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"the fake ollama serve did not start (exit {proc.poll()})")
        started = json.loads(line)
        yield FakeTree(proc, int(started["runner_pid"]), int(started["runner_port"]))
    finally:
        proc.terminate()  # it stops its runner
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        shutil.rmtree(folder, ignore_errors=True)


def discovery_cli_as(user: str, url: str) -> dict[str, object]:
    """``python -m collectors.ollama --ollama URL --json`` as ``user``: the runners it finds and reads, and why not."""
    py, env = python_for(user)
    entry = pwd.getpwnam(user)
    out = subprocess.run(
        [*py, "-m", "collectors.ollama", "--ollama", url, "--json"],
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    found: dict[str, object] = json.loads(out.stdout)
    return found
