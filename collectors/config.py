"""The collector's settings: command-line options, their environment variables, and checks.

``parse_ollama_host`` follows Ollama's own ``envconfig.Host`` rules (docs/ollama-api.md §10)
so that ``OLLAMA_HOST`` means the same thing to Phasewatch as to the server; the rest is
plain argparse. Every wrong setting becomes a ``SettingsError`` whose text is one line
that says what is wrong and what to do; ``__main__`` prints it and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs

from analysis.loopback import is_loopback
from collectors.ollama.journal import valid_unit_name
from collectors.ollama.log_places import default_log
from collectors.os_users import effective_uid, group_members, group_name, user_name
from collectors.proxy.access import split_list
from collectors.proxy.limits import Limits
from store.schema import db_path as store_db_path

DEFAULT_OLLAMA_PORT = "11434"
DEFAULT_LISTEN = "127.0.0.1:11435"
DEFAULT_INTERVAL_S = 1.0
DEFAULT_SAMPLES_RETENTION_DAYS = 7.0
DEFAULT_REQUESTS_RETENTION_DAYS = 90.0
DEFAULT_MAX_DB_MB = 1024.0
TOKEN_MIN_CHARS = 16  # PHASEWATCH_TOKEN: long enough not to be guessed over the network

_GO_INT = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt(s, 10, 32) accepts
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class SettingsError(ValueError):
    """A setting that cannot be used; ``str()`` is one line meant for the user."""


@dataclass(frozen=True)
class OllamaHost:
    """``OLLAMA_HOST`` parsed as Ollama does: scheme, host (no brackets), port (text), path."""

    scheme: str
    host: str
    port: str
    path: str = ""

    def __str__(self) -> str:
        """Render like Go's ``url.URL.String()`` for the URL Ollama builds."""
        path = self.path
        if path and not path.startswith("/"):
            path = "/" + path
        return f"{self.scheme}://{_join_host_port(self.host, self.port)}{path}"

    def connectable(self) -> OllamaHost:
        """The address a client should dial: unspecified bind addresses become loopback.

        Ollama's ``ConnectableHost`` maps 0.0.0.0 → 127.0.0.1 and :: → ::1. We also map
        the empty host of ``:1234`` (which binds all interfaces) to 127.0.0.1, as the
        Python client does, because an empty host cannot be dialled.
        """
        if self.host == "":
            return OllamaHost(self.scheme, "127.0.0.1", self.port, self.path)
        ip = _parse_ip(self.host)
        if ip is not None and ip.is_unspecified:
            loopback = "127.0.0.1" if ip.version == 4 else "::1"
            return OllamaHost(self.scheme, loopback, self.port, self.path)
        return self


def _go_trim_var(value: str) -> str:
    """``envconfig.Var``: trim spaces, then quotes (both kinds) at either end."""
    return value.strip(" \t\n\r\v\f").strip("\"'")


def _split_host_port(hostport: str) -> tuple[str, str] | None:
    """Go's ``net.SplitHostPort``, step by step: None where Go returns an error."""
    last_colon = hostport.rfind(":")
    if last_colon < 0:
        return None  # missing port
    no_open_from, no_close_from = 0, 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or end + 1 != last_colon:
            return None  # missing ']', missing port, or too many colons
        host = hostport[1:end]
        no_open_from, no_close_from = 1, end + 1
    else:
        host = hostport[:last_colon]
        if ":" in host:
            return None  # too many colons
    if "[" in hostport[no_open_from:] or "]" in hostport[no_close_from:]:
        return None
    return host, hostport[last_colon + 1 :]


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Go's ``net.ParseIP``: plain IPv4 or IPv6 literals, no zones."""
    if "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _go_ip_string(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Go's ``net.IP.String()``: IPv4-mapped IPv6 prints as dotted IPv4."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_ollama_host(value: str | None) -> OllamaHost:
    """Parse an ``OLLAMA_HOST`` value exactly as Ollama's ``envconfig.Host`` does.

    Pure: no environment, no network. ``None`` or empty gives ``http://127.0.0.1:11434``.
    Invalid ports silently fall back to the scheme's default, as in Ollama.
    """
    text = _go_trim_var(value or "").strip()
    default_port = DEFAULT_OLLAMA_PORT
    scheme, sep, hostport = text.partition("://")
    if not sep:
        scheme, hostport = "http", text
        if text == "ollama.com":
            scheme, hostport = "https", "ollama.com:443"
    elif scheme == "http":
        default_port = "80"
    elif scheme == "https":
        default_port = "443"

    hostport, _, path = hostport.partition("/")
    split = _split_host_port(hostport)
    if split is None:
        host, port = "127.0.0.1", default_port
        ip = _parse_ip(hostport.strip("[]"))
        if ip is not None:
            host = _go_ip_string(ip)
        elif hostport != "":
            host = hostport
    else:
        host, port = split

    if not _GO_INT.fullmatch(port) or not 0 <= int(port) <= 65535:
        port = default_port
    return OllamaHost(scheme=scheme, host=host, port=port, path=path)


def ollama_base_url(value: str | None) -> str:
    """The URL to connect to for an ``OLLAMA_HOST`` value, without a trailing slash.

    Raises SettingsError for what cannot be proxied (a scheme other than http/https).
    """
    parsed = parse_ollama_host(value).connectable()
    if parsed.scheme not in ("http", "https"):
        raise SettingsError(
            f"--ollama/OLLAMA_HOST {value!r}: scheme {parsed.scheme!r} is not supported; "
            "give an http:// or https:// address such as http://127.0.0.1:11434"
        )
    return str(parsed).rstrip("/")


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int  # 0 asks the OS for a free port; the chosen one goes in the lock file

    def __str__(self) -> str:
        return _join_host_port(self.host, str(self.port))


def parse_listen(value: str) -> ListenAddress:
    """Parse ``HOST:PORT`` (``[::1]:11435`` for IPv6) for the proxy to listen on."""
    text = value.strip()
    split = _split_host_port(text)
    if split is None or split[0] == "" or not re.fullmatch(r"[0-9]{1,5}", split[1]):
        raise SettingsError(f"--listen/PHASEWATCH_LISTEN {value!r} is not HOST:PORT; give e.g. 127.0.0.1:11435 or [::1]:11435")
    host, port_text = split
    port = int(port_text)
    if port > 65535:
        raise SettingsError(f"--listen/PHASEWATCH_LISTEN {value!r}: port {port} is above 65535; choose a port in 1-65535")
    return ListenAddress(host=host, port=port)


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(f"{name}={value!r} is not a yes/no value; use 1 or 0")


@dataclass(frozen=True)
class Settings:
    """Everything the collector process needs to run, already checked."""

    ollama_url: str  # connectable upstream, e.g. "http://127.0.0.1:11434"
    listen: ListenAddress
    data_dir: Path
    interval_s: float
    record_text: bool
    demo: bool
    samples_retention_days: float
    requests_retention_days: float
    max_db_bytes: int
    ollama_pids: tuple[int, ...] = ()  # override for the host/GPU samplers; empty = find by name
    limits: Limits = field(default_factory=Limits)  # the proxy's bounds (PHASEWATCH_MAX_HEAD_BYTES, ...)
    allowed_hosts: tuple[str, ...] = ()  # Host names answered beyond this machine's (PHASEWATCH_ALLOWED_HOSTS)
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed beyond Ollama's defaults (OLLAMA_ORIGINS)
    token: str | None = field(default=None, repr=False)  # PHASEWATCH_TOKEN: every request must carry it (Bearer)
    ollama_log: Path | None = None  # Ollama's log, read for its runners' progress lines (PHASEWATCH_OLLAMA_LOG)
    ollama_journal: str | None = None  # or the systemd unit whose journal holds it (PHASEWATCH_OLLAMA_JOURNAL)
    journal_dir: Path | None = None  # read that unit from these journal files, not the system's (tests, debugging)
    exit_with_parent: bool = False  # stop when the process that started us exits (the app's own collector)
    stop: bool = False  # --stop: stop the collector of data_dir instead of running one

    @property
    def db_path(self) -> Path:
        return store_db_path(self.data_dir)


_THIS_MACHINE = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""}


def _check_not_self(ollama_url: str, listen: ListenAddress) -> None:
    """Refuse an upstream that is our own listening address: every request would loop back to us.

    Easy to hit: clients are told OLLAMA_HOST=127.0.0.1:11435, and a collector started
    from that same shell would read it as Ollama's address.
    """
    parsed = parse_ollama_host(ollama_url)
    if listen.port == 0 or parsed.port != str(listen.port):
        return
    same_host = parsed.host == listen.host or (parsed.host in _THIS_MACHINE and listen.host in _THIS_MACHINE)
    if same_host:
        raise SettingsError(
            f"--ollama/OLLAMA_HOST ({ollama_url}) is this collector's own --listen address {listen}; "
            "point --ollama at Ollama itself, usually http://127.0.0.1:11434"
        )


def load_token(env: Mapping[str, str], listen: ListenAddress) -> str | None:
    """``PHASEWATCH_TOKEN``: required to listen beyond loopback (other machines then reach Ollama through us).

    From the environment only, never an option: a command line is visible to every user of the machine.
    """
    token = env.get("PHASEWATCH_TOKEN", "").strip() or None
    if token is not None and len(token) < TOKEN_MIN_CHARS:
        raise SettingsError(
            f"PHASEWATCH_TOKEN is {len(token)} characters; give at least {TOKEN_MIN_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if token is None and not is_loopback(listen.host):
        raise SettingsError(
            f"--listen/PHASEWATCH_LISTEN {listen} is beyond loopback: other machines could use Ollama through it "
            "and read its metrics; set PHASEWATCH_TOKEN (at least 16 characters) so every request must carry it, "
            "or listen on 127.0.0.1"
        )
    return token


def client_auth_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What Phasewatch's own clients of the collector (the Lab, the demo's users) send, so that a collector that
    needs a token answers them: ``Authorization: Bearer $PHASEWATCH_TOKEN`` when it is set, else nothing."""
    token = (os.environ if env is None else env).get("PHASEWATCH_TOKEN", "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("phasewatch", appauthor=False))


class _OneLineParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so errors stay one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(f"{message} (see python -m collectors --help)")


def build_parser() -> argparse.ArgumentParser:
    limits = ", ".join(f"{limit_env_name(f.name)} ({f.default})" for f in dataclasses.fields(Limits))
    p = _OneLineParser(
        prog="python -m collectors",
        description="Phasewatch collector: a recording proxy in front of Ollama, plus Ollama, GPU and host samplers.",
        epilog=(
            "The proxy answers only this machine's Host names (add others to PHASEWATCH_ALLOWED_HOSTS, "
            "comma-separated, * for any) and the browser origins Ollama allows (plus OLLAMA_ORIGINS). "
            "Listening beyond loopback needs PHASEWATCH_TOKEN: then every request (proxy and /phasewatch/metrics) "
            "must carry 'Authorization: Bearer <token>', or gets 401 and is not recorded. "
            f"Its bounds, by environment variable (default): {limits}."
        ),
    )
    p.add_argument("--ollama", metavar="URL", help="Ollama to watch; default $OLLAMA_HOST, else http://127.0.0.1:11434")
    p.add_argument(
        "--listen", metavar="HOST:PORT", help=f"where the proxy listens; default $PHASEWATCH_LISTEN, else {DEFAULT_LISTEN}"
    )
    p.add_argument(
        "--data", metavar="DIR", help="data folder for the store and lock; default $PHASEWATCH_DATA, else the user data folder"
    )
    p.add_argument(
        "--interval", metavar="SECONDS", help=f"sampling interval; default $PHASEWATCH_INTERVAL, else {DEFAULT_INTERVAL_S:g}"
    )
    p.add_argument(
        "--record-text",
        action="store_true",
        default=None,
        help="also store prompt and response text (off; or PHASEWATCH_RECORD_TEXT=1)",
    )
    p.add_argument(
        "--demo", action="store_true", help="the upstream is sim/: sample its virtual GPU from /sim/gpu instead of NVML"
    )
    p.add_argument(
        "--samples-days",
        metavar="DAYS",
        help=f"keep samples this long; default $PHASEWATCH_SAMPLES_DAYS, else {DEFAULT_SAMPLES_RETENTION_DAYS:g}",
    )
    p.add_argument(
        "--requests-days",
        metavar="DAYS",
        help=f"keep requests this long; default $PHASEWATCH_REQUESTS_DAYS, else {DEFAULT_REQUESTS_RETENTION_DAYS:g}",
    )
    p.add_argument(
        "--max-db-mb", metavar="MB", help=f"bound on the store's size; default $PHASEWATCH_MAX_DB_MB, else {DEFAULT_MAX_DB_MB:g}"
    )
    p.add_argument(
        "--stop", action="store_true", help="stop the collector that records into --data (or $PHASEWATCH_DATA), then exit"
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one exits (how the dashboard starts its collector)",
    )
    p.add_argument(
        "--ollama-pids", metavar="PID,PID", help="Ollama's process ids for the samplers (default: found by process name)"
    )
    p.add_argument(
        "--ollama-log",
        metavar="PATH",
        help="Ollama's log file, read for its runners' timing and prompt-progress lines; default $PHASEWATCH_OLLAMA_LOG, "
        "else where Ollama keeps it for a local Ollama (macOS ~/.ollama/logs/server.log, Homebrew "
        "$(brew --prefix)/var/log/ollama.log, Windows %%LOCALAPPDATA%%\\Ollama\\server.log) when that file exists; "
        "PHASEWATCH_OLLAMA_LOG set empty: none",
    )
    p.add_argument(
        "--ollama-journal",
        metavar="UNIT",
        help="or the systemd unit whose journal holds Ollama's log (journalctl -u UNIT), usually ollama; "
        "default $PHASEWATCH_OLLAMA_JOURNAL, else none. Not with --ollama-log. "
        "$PHASEWATCH_JOURNAL_DIR (tests, debugging): read journal files in that folder instead of the system's",
    )
    return p


def _ollama_log(text: str | None) -> Path | None:
    """The log to follow; it may not exist yet (Ollama creates it), but it cannot be a folder."""
    if text is None or not text.strip():
        return None
    path = Path(text.strip()).expanduser()
    if path.is_dir():
        raise SettingsError(
            f"--ollama-log/PHASEWATCH_OLLAMA_LOG {text!r} is a folder; give Ollama's log file, e.g. ~/.ollama/logs/server.log"
        )
    return path


def _log_where_ollama_keeps_it(ollama_url: str, env: Mapping[str, str]) -> Path | None:
    """Without --ollama-log, PHASEWATCH_OLLAMA_LOG (set, even empty: none) or --ollama-journal: the log where the
    watched Ollama's OS keeps it (collectors/ollama/log_places.py), when that Ollama is on this machine."""
    host = urlsplit(ollama_url).hostname or ""
    if not is_loopback(host):
        return None  # a remote Ollama's log is on its own machine
    return default_log(env, Path(env["HOME"]) if env.get("HOME") else Path.home())


def _ollama_journal(args: argparse.Namespace, env: Mapping[str, str], log: Path | None) -> tuple[str | None, Path | None]:
    """The unit whose journal to follow and the journal folder to read it from (None: the system's)."""
    option = args.ollama_journal is not None
    text = (args.ollama_journal if option else env.get("PHASEWATCH_OLLAMA_JOURNAL", "")).strip()
    if not text:
        if option:
            raise SettingsError("--ollama-journal is empty; give Ollama's systemd unit, usually ollama")
        return None, None
    name = "--ollama-journal" if option else "PHASEWATCH_OLLAMA_JOURNAL"
    if log is not None:
        log_name = "--ollama-log" if args.ollama_log is not None else "PHASEWATCH_OLLAMA_LOG"
        raise SettingsError(
            f"{log_name} and {name} are both given; Ollama's log is read from one place: give either the log file "
            "or the systemd unit whose journal holds it, not both"
        )
    if not valid_unit_name(text):
        raise SettingsError(f"{name} {text!r} is not a systemd unit name; give Ollama's unit, usually ollama")
    folder = env.get("PHASEWATCH_JOURNAL_DIR", "").strip()
    journal_dir = Path(folder).expanduser() if folder else None
    if journal_dir is not None and not journal_dir.is_dir():
        raise SettingsError(
            f"PHASEWATCH_JOURNAL_DIR {folder!r} is not a folder; give a folder of journal files, or unset it to read "
            "the system's journal"
        )
    return text, journal_dir


def _positive_float(name: str, text: str, *, limit: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name} {text!r} is not a number; give a positive number such as 1") from None
    if not (value > 0 and value <= limit):  # also rejects NaN
        raise SettingsError(f"{name} {text!r} is out of range; give a number above 0 and at most {limit:g}")
    return value


def _pid_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SettingsError(f"--ollama-pids {text!r} is not a list of process ids; give e.g. 1234,1240")
    return tuple(int(p) for p in parts)


def limit_env_name(name: str) -> str:
    return "PHASEWATCH_" + name.upper()


def load_limits(env: Mapping[str, str]) -> Limits:
    """The proxy's bounds: each field of ``Limits`` from ``PHASEWATCH_<NAME>`` when set, else its default."""
    values: dict[str, float | int] = {}
    for f in dataclasses.fields(Limits):
        env_name = limit_env_name(f.name)
        text = env.get(env_name, "").strip()
        if not text:
            continue
        number = _positive_float(env_name, text, limit=1e15)
        if f.type in (int, "int"):
            if not number.is_integer():
                raise SettingsError(f"{env_name} {text!r} is not a whole number; give e.g. {f.default}")
            values[f.name] = int(number)
        else:
            values[f.name] = number
    return Limits(**values)  # type: ignore[arg-type]


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Options win over environment variables, which win over defaults. Pure apart from argparse."""
    args = build_parser().parse_args(list(argv))

    ollama_value = args.ollama if args.ollama is not None else env.get("OLLAMA_HOST")
    ollama_url = ollama_base_url(ollama_value)

    listen = parse_listen(args.listen if args.listen is not None else env.get("PHASEWATCH_LISTEN") or DEFAULT_LISTEN)

    data_text = args.data if args.data is not None else env.get("PHASEWATCH_DATA")
    if data_text is not None and not data_text.strip():
        raise SettingsError("--data/PHASEWATCH_DATA is empty; give a folder, or leave it unset for the default")
    data_dir = Path(data_text).expanduser() if data_text else default_data_dir()

    def number(option: str, value: str | None, env_name: str, default: float, limit: float) -> float:
        if value is not None:
            return _positive_float(option, value, limit=limit)
        if env.get(env_name, "").strip():
            return _positive_float(env_name, env[env_name], limit=limit)
        return default

    interval_s = number("--interval", args.interval, "PHASEWATCH_INTERVAL", DEFAULT_INTERVAL_S, 3600)
    record_text = (
        args.record_text
        if args.record_text is not None
        else parse_bool("PHASEWATCH_RECORD_TEXT", env.get("PHASEWATCH_RECORD_TEXT", ""))
    )
    samples_days = number("--samples-days", args.samples_days, "PHASEWATCH_SAMPLES_DAYS", DEFAULT_SAMPLES_RETENTION_DAYS, 36500)
    requests_days = number(
        "--requests-days", args.requests_days, "PHASEWATCH_REQUESTS_DAYS", DEFAULT_REQUESTS_RETENTION_DAYS, 36500
    )
    max_db_mb = number("--max-db-mb", args.max_db_mb, "PHASEWATCH_MAX_DB_MB", DEFAULT_MAX_DB_MB, 1e7)
    _check_not_self(ollama_url, listen)
    pids = _pid_list(args.ollama_pids) if args.ollama_pids is not None else ()
    ollama_log = _ollama_log(args.ollama_log if args.ollama_log is not None else env.get("PHASEWATCH_OLLAMA_LOG"))
    ollama_journal, journal_dir = _ollama_journal(args, env, ollama_log)
    # The demo's simulator is not the Ollama whose log lies where Ollama keeps it: never read for it.
    if args.ollama_log is None and "PHASEWATCH_OLLAMA_LOG" not in env and ollama_journal is None and not args.demo:
        ollama_log = _log_where_ollama_keeps_it(ollama_url, env)

    return Settings(
        ollama_url=ollama_url,
        listen=listen,
        data_dir=data_dir,
        interval_s=interval_s,
        record_text=bool(record_text),
        demo=bool(args.demo),
        samples_retention_days=samples_days,
        requests_retention_days=requests_days,
        max_db_bytes=int(max_db_mb * 1024 * 1024),
        ollama_pids=pids,
        limits=load_limits(env),
        allowed_hosts=split_list(env.get("PHASEWATCH_ALLOWED_HOSTS", "")),
        # Ollama's envconfig.Var: trimmed, then unquoted; entries split on ","
        allowed_origins=split_list(_go_trim_var(env.get("OLLAMA_ORIGINS", ""))),
        token=load_token(env, listen),
        ollama_log=ollama_log,
        ollama_journal=ollama_journal,
        journal_dir=journal_dir,
        exit_with_parent=bool(args.exit_with_parent),
        stop=bool(args.stop),
    )


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data folder (private: 0700) and check it is ours and writable only by us; SettingsError otherwise.

    A folder another user owns or can write lets that user put a symbolic link where the collector creates a
    file (the lock, the store), and so make it overwrite any file our user can write.
    """
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(
            f"--data/PHASEWATCH_DATA {str(data_dir)!r} cannot be created ({exc.strerror}); choose a folder you can write"
        ) from None
    if not data_dir.is_dir():
        raise SettingsError(f"--data/PHASEWATCH_DATA {str(data_dir)!r} is not a folder; choose a folder")
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise SettingsError(f"--data/PHASEWATCH_DATA {str(data_dir)!r} is not writable; choose a folder you can write")
    if (unsafe := _not_private(data_dir)) is not None:
        raise SettingsError(f"--data/PHASEWATCH_DATA {str(data_dir)!r} {unsafe}")


def _not_private(folder: Path) -> str | None:
    """Why another local user could replace the files in ``folder`` (None: only we can, or the OS has no POSIX
    owners and modes to judge by: on Windows a folder under the user's profile is private by its ACL)."""
    me = effective_uid()
    if me is None:
        return None
    st = folder.stat()
    mode = f"mode {stat.S_IMODE(st.st_mode):o}"
    own = f"choose a folder of your own (the default is {default_data_dir()})"
    if st.st_uid != me:
        owner, runner = user_name(st.st_uid), user_name(me)
        return f"belongs to {owner!r}, not to {runner!r} who runs the collector; that user could make it overwrite files: {own}"
    if st.st_mode & stat.S_IWOTH:
        return f"can be written by every user on this machine ({mode}): run `chmod go-w {folder}`, or {own}"
    if st.st_mode & stat.S_IWGRP and _group_has_others(st.st_gid, me):
        name = group_name(st.st_gid)
        group = repr(name) if name is not None else f"gid {st.st_gid}"
        return f"can be written by the group {group}, which has other users ({mode}): run `chmod g-w {folder}`, or {own}"
    return None


def _group_has_others(gid: int, uid: int) -> bool:
    """Whether users other than ``uid`` belong to group ``gid`` (a user's private group has none)."""
    members = group_members(gid)
    if members is None:
        return True  # unknown: assume so
    me = user_name(uid)
    return gid != os.getegid() or any(member != me for member in members)
