"""Real OS users for tests: create them (root only; CI runs as root) and run our Python as them.

Another user must be able to run an interpreter and read the repository and its packages. The venv's
``python`` is a link to the interpreter it was made from, which may live under a folder other users cannot
enter (pyenv under ``/root``, mode 700). So ``python_for`` prefers, in order: this interpreter, then a system
one of the same version (``/usr/bin/python3.11``) with this venv's packages on ``PYTHONPATH`` (the compiled
ones are built for that version); it never changes a permission. It fails, saying why, where neither works.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_process import require_llama_server
from tests.support.sim_process import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


def require_root() -> None:
    """Creating users and running processes as them needs root: CI has it (skip elsewhere, fail under CI's flag)."""
    if os.geteuid() != 0:
        message = "two-user tests need root (to create users and run processes as them); CI runs as root"
        if os.environ.get("PHASEWATCH_REQUIRE_ENGINE") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def ensure_user(name: str) -> pwd.struct_passwd:
    """A system user without a home or shell (created when missing; kept afterwards: other tests may share it)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return pwd.getpwnam(name)


def _works(user: str, argv: list[str], env: dict[str, str]) -> bool:
    probe = [*argv, "-c", "import sys, psutil, aiohttp, collectors.ollama.discovery; print(sys.version_info[:2])"]
    try:
        out = subprocess.run(
            probe,
            user=user,
            group=pwd.getpwnam(user).pw_gid,
            extra_groups=[],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == str(sys.version_info[:2])


@functools.cache
def python_for(user: str) -> tuple[list[str], dict[str, str]]:
    """(argv prefix that runs our Python as ``user``, the environment it needs); found once per user."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp", "LANG": "C.UTF-8"}
    own = dict(env, PYTHONPATH=str(REPO_ROOT))
    if _works(user, [sys.executable], own):
        return [sys.executable], own
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    packages = dict(env, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), sysconfig.get_paths()["purelib"]]))
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if Path(candidate).is_file() and _works(user, [candidate], packages):
            return [candidate], packages
    pytest.fail(
        f"user {user} can run neither {sys.executable} nor a system Python {version} with this venv's packages: "
        f"make the interpreter's folders and {REPO_ROOT} readable by other users (chmod o+rx), or install "
        f"python{version} from Debian",
        pytrace=False,
    )


def popen_as(user: str, argv: list[str], env: dict[str, str], **kwargs: object) -> subprocess.Popen[bytes]:
    """``argv`` as ``user`` (its own group, none of root's supplementary groups), from a folder anyone can enter."""
    entry = pwd.getpwnam(user)
    return subprocess.Popen(argv, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], env=env, cwd="/", **kwargs)  # type: ignore[call-overload]


@contextlib.contextmanager
def sim_as(user: str, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m sim`` as ``user`` on a free port; (base URL, process) once it answers; stopped after."""
    py, env = python_for(user)
    port = free_port()
    binary, _ = require_llama_server()
    with tempfile.TemporaryFile() as log:
        proc = popen_as(
            user,
            [*py, "-m", "sim", "--port", str(port), *args],
            dict(env, PHASEWATCH_LLAMA_SERVER=str(binary)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"sim as {user} exited with {proc.returncode}: {log.read()[-2000:]!r}")
                with (
                    contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                    urllib.request.urlopen(url + "/", timeout=1.0),
                ):
                    break
                assert time.monotonic() < deadline, f"sim as {user} did not answer within {START_TIMEOUT_S} s"
                time.sleep(0.1)
            yield url, proc
        finally:
            proc.terminate()  # sim stops its llama-server child
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
