"""Find the runners of the Ollama being watched: its ``llama-server`` (or older ``ollama runner``) children.

Ollama >= 0.30 starts ``llama-server --model PATH --port N --host 127.0.0.1 ...`` per loaded GGUF model;
older ones ``ollama runner --model PATH --port N``. The Ollama server is the process listening on the
watched address (only when that address is this machine's); its runners are its children. The search starts
from the runners (few processes carry those names) and looks at their parents.

Which socket a connection to the watched address reaches is read from the system-wide socket table
(``/proc/net/tcp{,6}``: address, port, state, the owner's uid and the socket's inode), as the kernel picks
it: a socket bound to that exact address before one bound to every address (``0.0.0.0``, ``::``). The
exact address counts, not the port number alone: ``127.0.0.2:11434`` is not ``127.0.0.1:11434``, and any
local user may listen there. A runner is adopted only when its parent holds the socket(s) reached at the
watched address, the runner holds those reached at its own ``--port``, and runner and server are one uid.
Who holds a socket is known in one of two ways:

* **by process (same user)**: the parent's open files are ours to read (``/proc/PID/fd``: ``socket:[INODE]``),
  so the socket's inode names its process;
* **by command line + listening sockets (Ollama runs as another user)**, the official Linux install: another
  user's open files cannot be read, but every user can read a process's command line, parent and owner
  (``/proc/PID/{cmdline,stat,status}``) and the socket table. A runner is adopted when its own port listens
  here (same network namespace) owned by the runner's uid, its parent is an Ollama server by its command line
  (``ollama serve``, or ``python -m sim``) whose uid alone owns the socket(s) reached at the watched address,
  and no other Ollama server of that uid could be the one on that port.

Never a runner of another Ollama: each test above that fails says why, and ``Discovery.problem`` says it with
what to do (another network namespace such as Docker, ``hidepid`` on ``/proc``, a remote Ollama). Which
loaded model a runner serves: Ollama's blob files are named ``sha256-<digest>``; any other file is hashed once,
and only a regular file (opened without blocking, at most ``MAX_HASHED_BYTES``): a FIFO or a device given as
the model never stalls or spins discovery.

Every failure (a process that exits meanwhile, a file that cannot be read) gives fewer runners, never an
exception. ``ProcessWatch`` tells from the process table alone (no HTTP) when a runner appears or goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import ipaddress
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import psutil

from analysis.loopback import is_loopback
from analysis.speculative import Speculation, draft_tokens_of, spec_types_of
from collectors.host.proctable import Named, Owner, ProcessNames, bare_name, owner_of
from collectors.os_users import user_name

log = logging.getLogger(__name__)

RUNNER_NAMES = ("llama-server",)
MLX_RUNNER = "mlx runner"  # Runner.kind of ``ollama runner --mlx-engine --model NAME --port N``
SIM_DEFAULT_PORT = 11434  # python -m sim without --port
_BLOB_DIGEST = re.compile(r"sha256[-:]([0-9a-f]{64})$")
MAX_REASONS_SHOWN = 3  # runners not adopted, each with why, in the problem's text (the sidebar is narrow)
NO_RUNNER = "no runner process here"  # discovery's problem when it saw no runner process at all


def with_loaded_models(problem: str, loaded: Sequence[str] | None, simulated: bool) -> str:
    """Discovery's problem beside what Ollama's /api/ps lists (``loaded``; None: not known), where no runner
    process was seen at all. Discovery sees processes, not models: "no model is loaded" is said only where
    /api/ps agrees, and a loaded model with no runner in sight is told as the disagreement it is."""
    if not problem.startswith(NO_RUNNER):
        return problem
    rest = problem[len(NO_RUNNER) :]
    if loaded is None:
        why = ""
    elif not loaded:
        why = " (no model is loaded)"
    elif simulated:
        why = " (the demo's simulator serves its models without runner processes)"
    else:
        names = ", ".join(loaded[:3]) + (f" and {len(loaded) - 3} more" if len(loaded) > 3 else "")
        why = (
            f", though Ollama's /api/ps lists {names} as loaded: its runners run where this collector cannot see "
            "their processes (another machine, a container, or another user's processes hidden from this one)"
        )
    return NO_RUNNER + why + rest


_TCP_LISTEN = "0A"  # the st column of /proc/net/tcp for a listening socket
# A model file not named by its digest is hashed only up to this size: a larger (or sparse) file would cost
# minutes of a core; Ollama's own blobs are named by their digest and never read.
MAX_HASHED_BYTES = 64 << 30
_HASH_BLOCK_BYTES = 1 << 20
RUNNER_CONNECT_HOST = "127.0.0.1"  # where the collector reaches a runner (``Runner.base_url``)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

FOUND_SAME_USER = "by process (same user)"
FOUND_OTHER_USER = "by command line + listening sockets (Ollama runs as another user)"


@dataclass(frozen=True)
class Runner:
    pid: int
    port: int
    model_path: str | None
    host: str = "127.0.0.1"
    n_ctx: int | None = None  # -c / --ctx-size as started
    n_parallel: int | None = None  # -np / --parallel
    kind: str = "llama-server"  # or "ollama runner", or MLX_RUNNER
    # The rest of the settings in force, as on its command line (None: not given, the runner's default holds).
    n_batch: int | None = None  # -b
    n_ubatch: int | None = None  # -ub
    cache_type_k: str | None = None  # -ctk (Ollama's Go runner: --kv-cache-type, for both)
    cache_type_v: str | None = None  # -ctv
    flash_attn: str | None = None  # -fa on|off|auto (a bare -fa, as older builds and the Go runner take it: on)
    gpu_layers: str | None = None  # -ngl: a number, auto or all
    threads: int | None = None  # -t
    speculation: Speculation = field(default_factory=Speculation)  # its draft model and speculative settings

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def ollama_local_address(ollama_url: str) -> tuple[tuple[IPAddress, ...], int] | None:
    """(the addresses a client of ``ollama_url`` connects to, its port) for a watched Ollama on this machine;
    None for a remote one. ``localhost`` may mean either loopback address: both are checked."""
    port = ollama_local_port(ollama_url)
    host = urlsplit(ollama_url).hostname
    if port is None or host is None:
        return None
    if host == "localhost":
        return (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")), port
    return (ipaddress.ip_address(host.strip("[]")),), port


def ollama_local_port(ollama_url: str) -> int | None:
    """The port of a watched Ollama on this machine, or None for a remote one (its runners are out of reach)."""
    parts = urlsplit(ollama_url)
    if not parts.hostname or not is_loopback(parts.hostname):
        return None
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


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


FLASH_ATTN_VALUES = {"on": "on", "off": "off", "auto": "auto", "true": "on", "false": "off", "1": "on", "0": "off"}


def _flash_attn(argv: Sequence[str]) -> str | None:
    """``-fa on|off|auto`` (llama-server), or a bare ``-fa``/``--flash-attn`` (older llama.cpp, Ollama's Go
    runner): on. The last one given wins."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, given = arg.partition("=")
        if name not in ("-fa", "--flash-attn"):
            continue
        following = argv[i + 1].lower() if i + 1 < len(argv) else ""
        word = given.lower() if eq else following
        value = FLASH_ATTN_VALUES.get(word, "on" if not eq else None)
    return value


def speculation_from_argv(argv: Sequence[str]) -> Speculation:
    """The draft model and speculative settings a llama-server command line gives (``analysis.speculative``), under
    today's names and the older ones; a value llama-server would refuse counts as not given."""
    return Speculation(
        draft_model=_option(argv, "--spec-draft-model", "-md", "--model-draft"),
        spec_types=spec_types_of(_option(argv, "--spec-type")) or (),
        draft_max_tokens=draft_tokens_of(_option(argv, "--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")),
        draft_min_tokens=draft_tokens_of(_option(argv, "--spec-draft-n-min", "--draft-min", "--draft-n-min")),
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _program(argv: Sequence[str]) -> str:
    """The program's bare name from a command line's first word, whichever separator its OS uses."""
    return bare_name(re.split(r"[\\/]", argv[0])[-1]) if argv else ""


def runner_from_argv(pid: int, name: str, argv: Sequence[str]) -> Runner | None:
    """A Runner when a process of this name and command line is one, else None."""
    name, exe = bare_name(name), _program(argv)
    if name in RUNNER_NAMES or exe in RUNNER_NAMES:
        kind = "llama-server"
    elif (name == "ollama" or exe == "ollama") and "runner" in argv[1:2]:
        # Apple Silicon's engine for safetensors models (Ollama's x/mlxrunner): no /slots; its lines are read by
        # collectors/ollama/mlx_log.py. --model names the model, not a file.
        kind = MLX_RUNNER if "--mlx-engine" in argv[2:] else "ollama runner"
    else:
        return None
    port = _int_or_none(_option(argv, "--port"))
    if port is None or not 0 < port < 65536:
        return None
    host = _option(argv, "--host") or "127.0.0.1"
    if not is_loopback(host) and host not in ("0.0.0.0", "::"):
        return None  # a runner bound elsewhere is not read (loopback only)
    return Runner(
        pid=pid,
        port=port,
        model_path=_option(argv, "--model", "-m"),
        n_ctx=_int_or_none(_option(argv, "--ctx-size", "-c")),
        n_parallel=_int_or_none(_option(argv, "--parallel", "-np")),
        kind=kind,
        n_batch=_int_or_none(_option(argv, "--batch-size", "-b")),
        n_ubatch=_int_or_none(_option(argv, "--ubatch-size", "-ub")),
        cache_type_k=_option(argv, "--cache-type-k", "-ctk", "--kv-cache-type"),
        cache_type_v=_option(argv, "--cache-type-v", "-ctv", "--kv-cache-type"),
        flash_attn=_flash_attn(argv),
        gpu_layers=_option(argv, "--gpu-layers", "--n-gpu-layers", "-ngl"),
        threads=_int_or_none(_option(argv, "--threads", "-t")),
        speculation=speculation_from_argv(argv),
    )


@dataclass(frozen=True)
class Discovery:
    """The runners found, how they were found, and why none were when that is known (with what to do)."""

    runners: list[Runner]
    found_by: str | None = None  # FOUND_SAME_USER or FOUND_OTHER_USER (both, joined, when both held)
    problem: str | None = None
    container: bool = False  # Ollama seems to run in a container (docker-proxy on its port, a runner out of reach)
    # A runner was turned down for a reason that can pass with no process coming or going (a port not bound yet):
    # look again on a timer. Otherwise only a change in the process table can change the answer.
    recheck: bool = False


@dataclass(frozen=True)
class ProcInfo:
    """What this user can read of one process."""

    pid: int
    ppid: int
    uid: Owner | None  # the real uid, or the user's name where the OS has no uids
    name: str
    argv: tuple[str, ...]
    sockets: frozenset[int] | None = None  # inodes of the sockets it holds; None: not ours to see (another user's)
    netns: str | None = None  # /proc/PID/ns/net's link, e.g. "net:[4026531840]"; None: not ours to see


@dataclass(frozen=True)
class HostView:
    """What this user can see of this machine: the processes that matter and the system-wide listening sockets."""

    procs: dict[int, ProcInfo]  # runners, their parents, Ollama servers, docker-proxy
    listening: list[Listener] | None  # every listening TCP socket in this network namespace; None: unreadable
    my_netns: str | None = None
    hidepid: str | None = None  # /proc's hidepid= mount option when set ("1", "2", "invisible", "noaccess", ...)
    other_users_visible: bool = True  # whether any process of another user could be read at all
    runners: list[Runner] = field(default_factory=list)


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket, as ``/proc/net/tcp{,6}`` lists it."""

    address: IPAddress
    port: int
    uid: Owner | None  # who created it (None: not known, psutil on another user's socket)
    inode: int  # names it in its holder's /proc/PID/fd (``socket:[INODE]``)

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if self.address.version == 6 else f"{self.address}:{self.port}"


def _proc_address(text: str) -> IPAddress:
    """``0100007F`` → 127.0.0.1: the kernel prints each 32-bit word of the address as a number in this machine's
    byte order."""
    if len(text) not in (8, 32):
        raise ValueError(text)
    raw = b"".join(int(text[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(text), 8))
    return ipaddress.ip_address(raw)


def listening_sockets(proc_root: Path = Path("/proc")) -> list[Listener] | None:
    """Every TCP socket listening in this network namespace, from ``net/tcp`` and ``net/tcp6`` (readable by
    every user); None where neither can be read (not Linux, or forbidden)."""
    out: list[Listener] = []
    read_any = False
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _TCP_LISTEN:
                continue
            try:
                address, port = cols[1].rsplit(":", 1)
                out.append(Listener(_proc_address(address), int(port, 16), int(cols[7]), int(cols[9])))
            except ValueError:
                continue
    return out if read_any else None


def serving(listeners: Sequence[Listener], address: IPAddress, port: int) -> list[Listener]:
    """The listening sockets a connection to ``address:port`` reaches, as the kernel chooses: one bound to
    that exact address before one bound to every address (IPv4 before IPv6 at each step). Several only
    where they share the port (``SO_REUSEPORT``, which the kernel allows one uid alone)."""
    on_port = [lis for lis in listeners if lis.port == port]
    tiers: list[IPAddress]
    if isinstance(address, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(f"::ffff:{address}")
        tiers = [address, mapped, ipaddress.IPv4Address("0.0.0.0"), ipaddress.IPv6Address("::")]
    else:
        tiers = [address, ipaddress.IPv6Address("::")]
    for tier in tiers:
        hit = [lis for lis in on_port if lis.address == tier]
        if hit:
            return hit
    return []


def _reached(view: HostView, addresses: Sequence[IPAddress], port: int) -> list[Listener]:
    """The sockets reached at any of ``addresses`` (``localhost`` has two) on ``port``."""
    out: list[Listener] = []
    for address in addresses:
        out.extend(lis for lis in serving(view.listening or [], address, port) if lis not in out)
    return out


def _where(addresses: Sequence[IPAddress], port: int) -> str:
    return " or ".join(str(Listener(a, port, 0, 0)) for a in addresses)


def proc_hidepid(proc_root: Path = Path("/proc")) -> str | None:
    """The ``hidepid=`` option /proc is mounted with (None when absent, or 0/off)."""
    try:
        lines = (proc_root / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, super_fields = left.split(), right.split()
        if len(fields) > 4 and fields[4] == "/proc" and super_fields[:1] == ["proc"]:
            for opt in (super_fields[2] if len(super_fields) > 2 else "").split(","):
                if opt.startswith("hidepid=") and opt[8:] not in ("0", "off"):
                    return opt[8:]
    return None


def server_port(p: ProcInfo) -> tuple[bool, int | None]:
    """(whether ``p`` is an Ollama server by its command line, the port its command line gives when it does).
    ``ollama serve`` takes its address from $OLLAMA_HOST, which another user cannot read."""
    if "ollama" in (bare_name(p.name), _program(p.argv)) and p.argv[1:2] == ("serve",):
        return True, None
    if any(a == "-m" and b == "sim" for a, b in zip(p.argv, p.argv[1:], strict=False)):
        return True, _int_or_none(_option(p.argv, "--port")) or SIM_DEFAULT_PORT
    return False, None


def docker_forwarded(view: HostView, port: int) -> str | None:
    """Where docker-proxy forwards the watched port to ("172.17.0.2:11434"), when it does."""
    for p in view.procs.values():
        if p.name == "docker-proxy" and _option(p.argv, "-host-port") == str(port):
            return f"{_option(p.argv, '-container-ip') or '?'}:{_option(p.argv, '-container-port') or '?'}"
    return None


def _user(uid: Owner | None) -> str:
    return uid if isinstance(uid, str) else user_name(uid)


def _as_user(uid: Owner | None) -> str:
    return f"run the collector as {_user(uid)} (sudo -u {_user(uid)} ...) or as root"


def _held_by(listeners: Sequence[Listener], p: ProcInfo) -> bool:
    """Whether ``p`` holds every one of ``listeners`` (its open files read: ``p.sockets`` is known)."""
    return p.sockets is not None and all(lis.inode in p.sockets for lis in listeners)


def _owners(listeners: Sequence[Listener]) -> str:
    return ", ".join(sorted({_user(lis.uid) for lis in listeners}))


def _runner_itself(view: HostView, runner: Runner, me: ProcInfo, parent: ProcInfo) -> str | None:
    """Why what answers on the runner's port may not be the runner its parent started (None: it is)."""
    runner_sockets = serving(view.listening or [], ipaddress.IPv4Address(RUNNER_CONNECT_HOST), runner.port)
    if not runner_sockets:
        if me.netns is not None and me.netns == view.my_netns:  # ours to see: it has not bound its port yet
            return f"nothing listens on its port {runner.port} (yet): it is read once it does"
        return (
            f"its port {runner.port} does not listen in this network namespace (a container such as "
            f"Docker?): run the collector in Ollama's network namespace"
        )
    if me.uid is None or me.uid != parent.uid:
        return f"it runs as {_user(me.uid)} but its parent (pid {parent.pid}) as {_user(parent.uid)}: not Ollama's runner"
    # Whoever answers on the runner's port is what the collector reads: it must be the runner itself.
    if me.sockets is not None and not _held_by(runner_sockets, me):
        return f"port {runner.port} is held by another process than the runner (pid {me.pid})"
    if {lis.uid for lis in runner_sockets} != {me.uid}:
        return f"port {runner.port} is held by {_owners(runner_sockets)}, not by the runner's user {_user(me.uid)}"
    return None


def _unreachable(view: HostView, me: ProcInfo, parent: ProcInfo) -> str | None:
    """Why the runner's port cannot be checked from here at all (another namespace, no socket table), or None."""
    if view.my_netns is not None and me.netns is not None and me.netns != view.my_netns:
        return (
            f"it runs in another network namespace ({me.netns}; a container such as Docker): its "
            f"port cannot be reached from here; run the collector in that namespace (docker run "
            f"--network container:NAME ..., or nsenter --net=/proc/{me.pid}/ns/net ... as root)"
        )
    if view.listening is None:
        return f"the system's socket table (/proc/net/tcp) cannot be read; {_as_user(parent.uid)}"
    return None


def _judge_other_user(
    view: HostView, parent: ProcInfo, server_sockets: Sequence[Listener], port: int, watched: str
) -> str | None:
    """Why ``parent``, whose sockets another user's process cannot read, is not the Ollama on ``watched``; None when
    it is, as far as its command line, its user and the other servers tell."""
    is_server, its_port = server_port(parent)
    if not is_server:
        return f"its parent (pid {parent.pid}, {parent.name}) is not an Ollama server (ollama serve)"
    if its_port is not None and its_port != port:
        return f"its parent (pid {parent.pid}) serves port {its_port}: another Ollama"
    if {lis.uid for lis in server_sockets} != {parent.uid}:
        return (
            f"its parent (pid {parent.pid}) runs as {_user(parent.uid)}, but {watched} is held by "
            f"{_owners(server_sockets)}: another Ollama"
        )
    rivals = [
        p
        for p in view.procs.values()
        if p.pid != parent.pid and p.uid == parent.uid and server_port(p)[0] and server_port(p)[1] in (None, port)
    ]
    if rivals:
        return (
            f"{len(rivals) + 1} Ollama servers run as {_user(parent.uid)} and another user cannot tell "
            f"which one listens on {watched}; {_as_user(parent.uid)}"
        )
    return None


def _judge(
    view: HostView, runner: Runner, port: int, addresses: Sequence[IPAddress] = (ipaddress.IPv4Address("127.0.0.1"),)
) -> tuple[str | None, str | None]:
    """(how it was found, None) when ``runner`` belongs to the Ollama listening on ``addresses`` at ``port``;
    else (None, why not)."""
    me = view.procs.get(runner.pid)
    parent = view.procs.get(me.ppid) if me is not None else None
    if me is None or parent is None:
        return None, "its parent process cannot be read"
    why = _unreachable(view, me, parent)
    if why is not None:
        return None, why
    watched = _where(addresses, port)
    server_sockets = _reached(view, addresses, port)
    if not server_sockets:
        return None, f"nothing listens on {watched} in this network namespace"
    why = _runner_itself(view, runner, me, parent)
    if why is not None:
        return None, why
    if parent.sockets is not None:  # ours to read: the socket's inode names its process
        if _held_by(server_sockets, parent):
            return FOUND_SAME_USER, None
        return None, f"its parent (pid {parent.pid}, {parent.name}) does not listen on {watched}: another Ollama"
    why = _judge_other_user(view, parent, server_sockets, port, watched)
    return (None, why) if why is not None else (FOUND_OTHER_USER, None)


def decide(view: HostView, port: int, addresses: Sequence[IPAddress] = (ipaddress.IPv4Address("127.0.0.1"),)) -> Discovery:
    """The runners of the Ollama listening on ``addresses`` at ``port``, judged from ``view`` alone."""
    found: list[Runner] = []
    ways: list[str] = []
    why_not: list[str] = []
    recheck = False
    for runner in view.runners:
        how, why = _judge(view, runner, port, addresses)
        if how is not None:
            found.append(runner)
            if how not in ways:
                ways.append(how)
        else:
            why_not.append(f"pid {runner.pid}: {why}")
            recheck = recheck or _not_bound_yet(view, runner, port, addresses)
    if found:
        return Discovery(found, " and ".join(ways), recheck=recheck)
    hints: list[str] = []
    forwarded = docker_forwarded(view, port)
    if forwarded is not None:
        hints.append(
            f"port {port} is forwarded by docker-proxy to a container ({forwarded}): Ollama runs in another "
            f"network namespace, whose runners cannot be reached from here; run the collector in the "
            f"container's network (docker run --network container:NAME ...)"
        )
    if view.hidepid is not None and not view.other_users_visible:
        hints.append(
            f"/proc is mounted with hidepid={view.hidepid}: other users' processes are hidden from this one; "
            f"if Ollama runs as another user, run the collector as that user, or have /proc mounted with a "
            f"gid= group you are in (mount -o remount,hidepid={view.hidepid},gid=GROUP /proc)"
        )
    if why_not:
        more = len(why_not) - MAX_REASONS_SHOWN
        shown = why_not[:MAX_REASONS_SHOWN] + ([f"and {more} more"] if more > 0 else [])
        head = f"{len(why_not)} runner(s) here, none of the Ollama on {_where(addresses, port)}: " + "; ".join(shown)
    else:
        head = NO_RUNNER
    contained = forwarded is not None or any("network namespace" in why for why in why_not)
    return Discovery([], None, "; ".join([head, *hints]), container=contained, recheck=recheck)


def _not_bound_yet(view: HostView, runner: Runner, port: int, addresses: Sequence[IPAddress]) -> bool:
    """Whether the runner's port or the watched address does not listen (yet): a runner starting, or Ollama
    restarting, binds it later with no process coming or going."""
    if view.listening is None:
        return False
    at_runner = serving(view.listening, ipaddress.IPv4Address(RUNNER_CONNECT_HOST), runner.port)
    return not at_runner or not _reached(view, addresses, port)


def socket_inodes(pid: int, proc_root: Path = Path("/proc")) -> frozenset[int] | None:
    """The inodes of the sockets process ``pid`` holds, from its open files; None where they cannot be read
    (another user's process, unless we are root; or gone)."""
    out: set[int] = set()
    try:
        with os.scandir(proc_root / str(pid) / "fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):  # closed meanwhile
                    target = os.readlink(fd.path)
                    if target.startswith("socket:[") and target.endswith("]"):
                        out.add(int(target[8:-1]))
    except (OSError, ValueError):
        return None
    return frozenset(out)


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


_Facts = tuple[int, Owner | None, str, tuple[str, ...]]  # ppid, owner, name, argv: fixed for a process's life
FactsCache = dict[tuple[int, float], _Facts]  # by (pid, start time): a pid reused is another process


def _info(proc: psutil.Process, *, sockets: bool, facts: FactsCache | None = None) -> ProcInfo | None:
    """What this user can read of ``proc``. Its parent, owner and command line come from ``facts`` when known
    (read once per process); the sockets it holds and its network namespace are read each time."""
    try:
        key = (proc.pid, proc.create_time())
        known = facts.get(key) if facts is not None else None
        if known is None:
            with proc.oneshot():
                known = (proc.ppid(), owner_of(proc), proc.name(), tuple(proc.cmdline()))
            if facts is not None:
                facts[key] = known
        ppid, uid, name, argv = known
        return ProcInfo(
            pid=proc.pid,
            ppid=ppid,
            uid=uid,
            name=name,
            argv=argv,
            sockets=socket_inodes(proc.pid) if sockets else None,
            netns=_netns(proc.pid),
        )
    except (psutil.Error, OSError):
        return None


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.Error, OSError):
        return None


def _candidates(
    table: dict[int, Named], facts: FactsCache | None
) -> tuple[dict[int, ProcInfo], list[Runner], list[tuple[int, Owner | None]]]:
    """The runners, Ollama servers and docker-proxy processes in the table, read; the pythons (possible sims) apart."""
    procs: dict[int, ProcInfo] = {}
    runners: list[Runner] = []
    pythons: list[tuple[int, Owner | None]] = []  # possible sims: read only when another user's runner needs it
    for pid, named in table.items():
        if named.name.startswith("python"):
            pythons.append((pid, named.uid))
            continue
        if bare_name(named.name) not in (*RUNNER_NAMES, "ollama", "docker-proxy"):
            continue
        proc = _process(pid)
        # a runner or an Ollama: whose sockets count
        info = _info(proc, sockets=named.name != "docker-proxy", facts=facts) if proc is not None else None
        if info is None:
            continue
        procs[info.pid] = info
        runner = runner_from_argv(info.pid, info.name, info.argv)
        if runner is not None:
            runners.append(runner)
    return procs, runners, pythons


def _add_parents(procs: dict[int, ProcInfo], runners: list[Runner], facts: FactsCache | None) -> None:
    """The runners' parents, with the sockets they hold (readable for our own processes only)."""
    for runner in runners:
        ppid = procs[runner.pid].ppid
        parent = procs.get(ppid)
        if (parent is None or parent.sockets is None) and (proc := _process(ppid)) is not None:
            info = _info(proc, sockets=True, facts=facts)
            if info is not None:
                procs[ppid] = info


def _add_sims(
    procs: dict[int, ProcInfo], runners: list[Runner], pythons: list[tuple[int, Owner | None]], facts: FactsCache | None
) -> None:
    """Another user's runner is judged against every Ollama server of its parent's user, sims included."""
    judged_by_command_line = {p.uid for r in runners if (p := procs.get(procs[r.pid].ppid)) and p.sockets is None}
    for pid, uid in pythons:
        proc = _process(pid) if uid in judged_by_command_line and pid not in procs else None
        if proc is not None and (info := _info(proc, sockets=False, facts=facts)) is not None:
            procs[info.pid] = info


def _my_owner() -> Owner | None:
    try:
        return owner_of(psutil.Process())
    except (psutil.Error, OSError):
        return None


def _listen_address(ip: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is not part of the address
    except ValueError:
        return None


def _system_listeners() -> list[tuple[int | None, str, int]] | None:
    """(holder pid or None, address, port) of every listening TCP socket, from psutil's system-wide table; None
    where the OS gives it to root alone (macOS)."""
    try:
        conns = psutil.net_connections("tcp")
    except (psutil.Error, OSError):
        return None
    return [(c.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr]


def _own_listeners(pids: Sequence[int]) -> list[tuple[int | None, str, int]] | None:
    """The listening TCP sockets of the processes ``pids`` that are ours to read; None when none is."""
    out: list[tuple[int | None, str, int]] = []
    read_any = False
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections("tcp")
        except (psutil.Error, OSError):
            continue
        read_any = True
        out.extend((pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr)
    return out if read_any else None


def psutil_listening(procs: dict[int, ProcInfo], me: Owner | None) -> list[Listener] | None:
    """The listening sockets as psutil sees them (every OS), where /proc/net cannot be read; each process in
    ``procs`` that is ours (run by ``me``, or ``me`` is root) is given the sockets it holds (``ProcInfo.sockets``,
    by an id of this look's own); another user's keeps None (not ours to see). psutil names a
    socket's holder only where the process is ours to read; another user's socket has no known owner, which keeps
    any runner behind it from being adopted. Where the system-wide table is root's alone (macOS), only the sockets
    of the candidates themselves are seen: a process of another user on the watched port goes unseen there."""
    found = _system_listeners()
    if found is None:
        found = _own_listeners(list(procs))
    if found is None:
        return None
    out: list[Listener] = []
    held: dict[int, set[int]] = {pid: set() for pid, p in procs.items() if me in (0, p.uid)}
    for i, (pid, ip, port) in enumerate(dict.fromkeys(found), start=1):
        address = _listen_address(ip)
        if address is None:
            continue
        holder = procs.get(pid) if pid is not None else None
        out.append(Listener(address, port, holder.uid if holder is not None else None, -i))
        if pid in held:
            held[pid].add(-i)
    for pid, ids in held.items():
        procs[pid] = dataclasses.replace(procs[pid], sockets=frozenset(ids))
    return out


def look(proc_root: Path = Path("/proc"), names: ProcessNames | None = None, facts: FactsCache | None = None) -> HostView:
    """What this user can see now: runner processes, their parents, Ollama servers, docker-proxy; the sockets.
    ``names`` and ``facts`` keep what was read of each process from one look to the next (``Discoverer``)."""
    my_uid = _my_owner()
    table = (names if names is not None else ProcessNames(owners=True)).refresh()
    if facts is not None:  # forget the processes gone
        for key in [key for key in facts if key[0] not in table or table[key[0]].create_time != key[1]]:
            del facts[key]
    others = any(named.uid is not None and named.uid != my_uid for named in table.values())
    procs, runners, pythons = _candidates(table, facts)
    _add_parents(procs, runners, facts)
    _add_sims(procs, runners, pythons, facts)
    listening = listening_sockets(proc_root)
    if listening is None:  # no /proc/net (macOS, Windows, or forbidden): the OS's own view, through psutil
        listening = psutil_listening(procs, my_uid)
    return HostView(
        procs=procs,
        listening=listening,
        my_netns=_netns("self"),
        hidepid=proc_hidepid(proc_root),
        other_users_visible=others,
        runners=runners,
    )


def discover(ollama_url: str) -> Discovery:
    """The runners of the Ollama at ``ollama_url``, how they were found, or why none were."""
    local = ollama_local_address(ollama_url)
    if local is None:
        return Discovery(
            [],
            None,
            (
                f"{ollama_url} is not on this machine: its runners cannot be read from here "
                f"(live progress falls back to estimates); run a collector on that machine to "
                f"read them"
            ),
        )
    addresses, port = local
    return decide(look(), port, addresses)


class Discoverer:
    """``discover`` that keeps, from one round to the next, what does not change during a process's life: every
    process's name and owner (``ProcessNames``: a round reads only new processes) and the candidates' parent,
    owner and command line (by pid and start time). The socket table and the sockets each candidate holds are
    read each round, once. Called from one thread at a time (``RunnerReader`` runs one round at a time)."""

    def __init__(self) -> None:
        self.names = ProcessNames(owners=True)
        self._facts: FactsCache = {}

    def __call__(self, ollama_url: str) -> Discovery:
        local = ollama_local_address(ollama_url)
        if local is None:
            return discover(ollama_url)  # remote: nothing to read
        addresses, port = local
        return decide(look(names=self.names, facts=self._facts), port, addresses)


_T = TypeVar("_T")


async def off_loop_daemon(fn: Callable[[], _T], name: str) -> _T:
    """``fn()`` in a daemon thread of its own, awaited. Unlike ``asyncio.to_thread`` (whose threads the interpreter
    joins at exit), a read that never returns (a stalled /proc or file system) cannot hold the collector's exit:
    cancelled, the awaiting task ends at once and the thread is left to end with the process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, exc: BaseException | None) -> None:
        if done.done():
            return  # cancelled meanwhile
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, exc = fn(), None
        except BaseException as e:  # handed to the awaiting task, which says it
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done


RUNNER_PROCESS_NAMES = (*RUNNER_NAMES, "ollama")
RunnerSet = frozenset[tuple[int, float, str]]  # (pid, start time, name) of each runner and Ollama process


class ProcessWatch:
    """Whether a runner process appeared or went, from the process table alone (no HTTP): the names of new
    processes only are read (``ProcessNames``), so a call costs a directory listing (``/proc``) and little more.
    A process is known by pid and start time (a pid reused is another process) and by name (a forked ``ollama``
    that execs ``llama-server`` is a change)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._names = ProcessNames(clock)
        self._runners: RunnerSet | None = None
        self._now: tuple[int, RunnerSet] | None = None  # the table's generation and the runner set read from it

    def runner_set(self) -> RunnerSet:
        """The runner (and ``ollama``) processes now (looked through again only when the process table changed:
        asked every second, a home machine's few hundred processes otherwise cost a millisecond each time)."""
        table = self._names.refresh()
        if self._now is None or self._now[0] != self._names.generation:
            found = frozenset(
                (pid, named.create_time, named.name)
                for pid, named in table.items()
                if bare_name(named.name) in RUNNER_PROCESS_NAMES
            )
            self._now = (self._names.generation, found)
        return self._now[1]

    def runners_changed(self) -> bool:
        """True when the set of runner (and ``ollama``) processes differs from the last call's (on the first: any)."""
        now = self.runner_set()
        # On the first call a runner already there counts as new: nothing may have looked for it yet.
        changed = now != self._runners if self._runners is not None else bool(now)
        self._runners = now
        return changed


class DigestCache:
    """Model file → sha256 digest; Ollama's blob names give it for free, other files are hashed once.

    Only a regular file is read: a FIFO would block the open or the read for good and a device such as
    ``/dev/zero`` never ends, so the path is looked at first, opened without blocking, and looked at again
    through the open file (it may have been swapped meanwhile); at most ``MAX_HASHED_BYTES``, and no more than
    the size it had when opened (a file growing while read does not keep the reader busy)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int, int, int], str] = {}

    def digest(self, path: str) -> str | None:
        m = _BLOB_DIGEST.search(Path(path).name)
        if m:
            return m.group(1)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None  # never opened: opening some devices does something
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HASHED_BYTES:
                return None
            key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in self._known:
                h = hashlib.sha256()
                left = st.st_size
                while left > 0:
                    block = os.read(fd, min(_HASH_BLOCK_BYTES, left))
                    if not block:
                        return None  # shorter than it was: changed while read
                    h.update(block)
                    left -= len(block)
                self._known[key] = h.hexdigest()
            return self._known[key]
        except OSError:
            return None
        finally:
            os.close(fd)
