"""Find the runners of the Ollama being watched: its ``llama-server`` (or older ``ollama runner``) children.

Ollama >= 0.30 starts ``llama-server --model PATH --port N --host 127.0.0.1 ...`` per loaded GGUF model;
older ones ``ollama runner --model PATH --port N``. The Ollama server is the process listening on the
watched port (only when that address is this machine's); its runners are its children. The search starts
from the runners (few processes carry those names) and asks only their parents what they listen on, which
needs no privilege for one's own processes (a system-wide socket list does on macOS). Which loaded model
a runner serves: Ollama's blob files are named ``sha256-<digest>``; any other file is hashed once.

Every failure (a remote Ollama, a process of another user, one that exits meanwhile) gives fewer runners,
never an exception.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

log = logging.getLogger(__name__)

RUNNER_NAMES = ("llama-server",)
_BLOB_DIGEST = re.compile(r"sha256[-:]([0-9a-f]{64})$")


@dataclass(frozen=True)
class Runner:
    pid: int
    port: int
    model_path: str | None
    host: str = "127.0.0.1"
    n_ctx: int | None = None  # -c / --ctx-size as started
    n_parallel: int | None = None  # -np / --parallel
    kind: str = "llama-server"  # or "ollama runner"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ollama_local_port(ollama_url: str) -> int | None:
    """The port of a watched Ollama on this machine, or None for a remote one (its runners are out of reach)."""
    parts = urlsplit(ollama_url)
    if not parts.hostname or not is_loopback_host(parts.hostname):
        return None
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def listens_on(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` listens on this TCP port (False when it cannot be asked)."""
    try:
        conns = proc.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one wins, as in llama.cpp's parser)."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
    return value


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def runner_of(proc: psutil.Process) -> Runner | None:
    """A Runner when ``proc`` is one (by name and command line), else None."""
    try:
        return runner_from_argv(proc.pid, proc.name(), proc.cmdline())
    except (psutil.Error, OSError):
        return None


def runner_from_argv(pid: int, name: str, argv: Sequence[str]) -> Runner | None:
    """A Runner when a process of this name and command line is one, else None."""
    exe = Path(argv[0]).name if argv else ""
    if name in RUNNER_NAMES or exe in RUNNER_NAMES:
        kind = "llama-server"
    elif (name == "ollama" or exe == "ollama") and "runner" in argv[1:2]:
        kind = "ollama runner"
    else:
        return None
    port = _int_or_none(_option(argv, "--port"))
    if port is None or not 0 < port < 65536:
        return None
    host = _option(argv, "--host") or "127.0.0.1"
    if not is_loopback_host(host) and host not in ("0.0.0.0", "::"):
        return None  # a runner bound elsewhere is not read (loopback only)
    return Runner(
        pid=pid,
        port=port,
        model_path=_option(argv, "--model", "-m"),
        n_ctx=_int_or_none(_option(argv, "--ctx-size", "-c")),
        n_parallel=_int_or_none(_option(argv, "--parallel", "-np")),
        kind=kind,
    )


def discover(ollama_url: str) -> tuple[list[Runner], str | None]:
    """The runners of the Ollama at ``ollama_url``, and why there are none when that is known."""
    port = ollama_local_port(ollama_url)
    if port is None:
        return [], f"{ollama_url} is not on this machine: its runners cannot be read"
    found: list[Runner] = []
    parents: dict[int, bool] = {}  # pid → listens on the watched port
    seen = 0
    for proc in psutil.process_iter(["name"]):
        if proc.info.get("name") not in (*RUNNER_NAMES, "ollama"):
            continue
        runner = runner_of(proc)
        if runner is None:
            continue
        seen += 1
        try:
            ppid = proc.ppid()
            if ppid not in parents:
                parents[ppid] = listens_on(psutil.Process(ppid), port)
        except (psutil.Error, OSError):
            continue
        if parents[ppid]:
            found.append(runner)
    if found:
        return found, None
    if seen:
        return [], f"{seen} runner(s) here, none a child of the process listening on port {port} (or not ours to see)"
    return [], "no runner process here (no model is loaded)"


class DigestCache:
    """Model file → sha256 digest; Ollama's blob names give it for free, other files are hashed once."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    def digest(self, path: str) -> str | None:
        m = _BLOB_DIGEST.search(Path(path).name)
        if m:
            return m.group(1)
        try:
            st = Path(path).stat()
        except OSError:
            return None
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self._known:
            h = hashlib.sha256()
            try:
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        h.update(block)
            except OSError:
                return None
            self._known[key] = h.hexdigest()
        return self._known[key]
