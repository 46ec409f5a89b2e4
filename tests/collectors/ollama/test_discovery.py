"""Discovery's judgement over what an unprivileged user sees: a fake /proc for the socket table and mount
options (as Linux writes them), and process views as psutil gives them for another user's processes (command
line, parent and owner readable; sockets not). The real two-user case: test_discovery_two_users.py."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from collectors.ollama.discovery import (
    FOUND_OTHER_USER,
    FOUND_SAME_USER,
    NO_RUNNER,
    HostView,
    Listener,
    ProcInfo,
    decide,
    listening_sockets,
    proc_hidepid,
    runner_from_argv,
    serving,
    with_loaded_models,
)

OLLAMA_UID, DESK_UID = 999, 1000
PORT = 11434
RUNNER_PORT = 43841
NETNS = "net:[4026531840]"
LOOPBACK = ipaddress.ip_address("127.0.0.1")
SERVER_INODE, RUNNER_INODE = 7001, 7002  # the sockets' inodes, as /proc/net/tcp and /proc/PID/fd name them

# Linux's /proc/net/tcp: 0100007F:2CAA is 127.0.0.1:11434 (st 0A: listening), owner uid in column 8.
_TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _tcp_line(i: int, addr: str, port: int, state: str, uid: int) -> str:
    return (
        f"{i:4}: {addr}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 "
        f"{uid:5}        0 {12345 + i} 1 0000000000000000 100 0 0 10 0\n"
    )


def fake_proc(tmp_path: Path, *, tcp: list[str], tcp6: list[str] | None = None, mountinfo: str = "") -> Path:
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    (root / "self").mkdir()
    (root / "net" / "tcp").write_text(_TCP_HEADER + "".join(tcp))
    if tcp6 is not None:
        (root / "net" / "tcp6").write_text(_TCP_HEADER + "".join(tcp6))
    (root / "self" / "mountinfo").write_text(mountinfo)
    return root


def test_the_socket_table_gives_listening_ports_and_their_owners(tmp_path: Path) -> None:
    root = fake_proc(
        tmp_path,
        tcp=[
            _tcp_line(0, "0100007F", PORT, "0A", OLLAMA_UID),
            _tcp_line(1, "0100007F", RUNNER_PORT, "0A", OLLAMA_UID),
            _tcp_line(2, "0100007F", 5555, "01", DESK_UID),  # established, not listening
            "garbage line\n",
        ],
        tcp6=[_tcp_line(0, "00000000000000000000000001000000", 8080, "0A", DESK_UID)],
    )
    assert listening_sockets(root) == [
        Listener(LOOPBACK, PORT, OLLAMA_UID, 12345),
        Listener(LOOPBACK, RUNNER_PORT, OLLAMA_UID, 12346),
        Listener(ipaddress.ip_address("::1"), 8080, DESK_UID, 12345),  # the kernel's spelling of ::1 (above)
    ]
    assert listening_sockets(tmp_path / "nothing") is None  # unreadable: unknown, not "nothing listens"


def test_hidepid_is_read_from_the_proc_mount(tmp_path: Path) -> None:
    hidden = "22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw,hidepid=invisible,gid=27\n"
    plain = "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    other = "30 27 0:21 / /mnt/proc rw - proc proc rw,hidepid=2\n"
    assert proc_hidepid(fake_proc(tmp_path / "a", tcp=[], mountinfo=hidden)) == "invisible"
    assert proc_hidepid(fake_proc(tmp_path / "b", tcp=[], mountinfo=plain + other)) is None
    assert proc_hidepid(fake_proc(tmp_path / "c", tcp=[], mountinfo=plain.replace("rw\n", "rw,hidepid=0\n"))) is None


# -- the judgement -------------------------------------------------------------------------------


def _runner_argv(port: int = RUNNER_PORT) -> tuple[str, ...]:
    return (
        "/usr/lib/ollama/llama-server",
        "--model",
        "/usr/share/ollama/.ollama/models/blobs/sha256-" + "a" * 64,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "-c",
        "4096",
        "-np",
        "1",
    )


def listen(port: int, uid: int, inode: int, address: str = "127.0.0.1") -> Listener:
    return Listener(ipaddress.ip_address(address), port, uid, inode)


def view(
    *procs: ProcInfo,
    listening: list[Listener] | None = None,
    hidepid: str | None = None,
    others_visible: bool = True,
) -> HostView:
    by_pid = {p.pid: p for p in procs}
    runners = [r for p in procs if (r := runner_from_argv(p.pid, p.name, p.argv)) is not None]
    if listening is None:
        listening = [listen(PORT, OLLAMA_UID, SERVER_INODE), listen(RUNNER_PORT, OLLAMA_UID, RUNNER_INODE)]
    return HostView(by_pid, listening, my_netns=NETNS, hidepid=hidepid, other_users_visible=others_visible, runners=runners)


def serve(pid: int = 100, uid: int = OLLAMA_UID, argv: tuple[str, ...] = ("/usr/local/bin/ollama", "serve")) -> ProcInfo:
    return ProcInfo(pid, 1, uid, "ollama", argv)  # another user's: listens and netns unreadable (None)


def runner(pid: int = 200, ppid: int = 100, port: int = RUNNER_PORT, uid: int = OLLAMA_UID) -> ProcInfo:
    return ProcInfo(pid, ppid, uid, "llama-server", _runner_argv(port))


def test_another_users_ollama_runner_is_found_by_command_line_and_sockets() -> None:
    found = decide(view(serve(), runner()), PORT)
    assert [r.pid for r in found.runners] == [200] and found.problem is None
    assert found.found_by == FOUND_OTHER_USER


def _mine(*sockets: int) -> ProcInfo:
    return ProcInfo(100, 1, DESK_UID, "ollama", ("ollama", "serve"), sockets=frozenset(sockets), netns=NETNS)


def _desk_sockets(*extra: Listener) -> list[Listener]:
    return [listen(PORT, DESK_UID, SERVER_INODE), listen(RUNNER_PORT, DESK_UID, RUNNER_INODE), *extra]


def test_our_own_ollama_is_found_by_process() -> None:
    found = decide(view(_mine(SERVER_INODE), runner(uid=DESK_UID), listening=_desk_sockets()), PORT)
    assert [r.pid for r in found.runners] == [200] and found.found_by == FOUND_SAME_USER


def test_a_runner_of_our_own_other_ollama_is_not_adopted() -> None:
    other = listen(11500, DESK_UID, 7003)
    found = decide(view(_mine(7003), runner(uid=DESK_UID), listening=_desk_sockets(other)), PORT)
    assert found.runners == [] and found.problem is not None
    assert "does not listen on 127.0.0.1:11434" in found.problem


def test_the_watched_address_counts_not_the_port_number() -> None:
    """A server listening on 127.0.0.2:11434 is not the one at 127.0.0.1:11434, whoever runs it (finding 3)."""
    fake = listen(PORT, DESK_UID, 7003, "127.0.0.2")
    # Ours to read: it holds a socket on port 11434, but not the one a client of 127.0.0.1 reaches.
    found = decide(view(_mine(7003), runner(uid=DESK_UID), listening=_desk_sockets(fake)), PORT)
    assert found.runners == [] and "does not listen on 127.0.0.1:11434" in (found.problem or "")
    # Another user's (judged by uid): 127.0.0.1:11434 is held by Ollama's user alone.
    sockets = [listen(PORT, OLLAMA_UID, SERVER_INODE), fake, listen(RUNNER_PORT, DESK_UID, RUNNER_INODE)]
    found = decide(view(serve(uid=DESK_UID), runner(uid=DESK_UID), listening=sockets), PORT)
    assert found.runners == [] and "127.0.0.1:11434 is held by" in (found.problem or "")
    # Only the fake listening: nothing is at the watched address at all.
    found = decide(view(serve(uid=DESK_UID), runner(uid=DESK_UID), listening=sockets[1:]), PORT)
    assert found.runners == [] and "nothing listens on 127.0.0.1:11434" in (found.problem or "")


def test_a_socket_on_every_address_serves_the_watched_one_unless_a_closer_one_does() -> None:
    any4, any6 = listen(PORT, OLLAMA_UID, 1, "0.0.0.0"), listen(PORT, DESK_UID, 2, "::")
    exact = listen(PORT, OLLAMA_UID, 3)
    assert serving([any6, any4], LOOPBACK, PORT) == [any4]
    assert serving([any6], LOOPBACK, PORT) == [any6]  # dual-stack: IPv4 clients reach it too
    assert serving([any6, any4, exact], LOOPBACK, PORT) == [exact]
    assert serving([any4], ipaddress.ip_address("::1"), PORT) == []
    # OLLAMA_HOST=0.0.0.0: the runner of the server on every address is adopted.
    found = decide(view(serve(), runner(), listening=[any4, listen(RUNNER_PORT, OLLAMA_UID, RUNNER_INODE)]), PORT)
    assert [r.pid for r in found.runners] == [200]


def test_runner_and_server_of_one_user_and_the_runner_holding_its_port() -> None:
    # The runner runs as another user than its parent: not what Ollama starts.
    found = decide(view(serve(), runner(uid=DESK_UID)), PORT)
    assert found.runners == [] and "not Ollama's runner" in (found.problem or "")
    # Its port is held by another user: what answers there is not the runner.
    sockets = [listen(PORT, OLLAMA_UID, SERVER_INODE), listen(RUNNER_PORT, DESK_UID, RUNNER_INODE)]
    found = decide(view(serve(), runner(), listening=sockets), PORT)
    assert found.runners == [] and f"port {RUNNER_PORT} is held by" in (found.problem or "")
    # Ours to read: a runner that does not hold the socket on its own port.
    me = ProcInfo(200, 100, DESK_UID, "llama-server", _runner_argv(), sockets=frozenset(), netns=NETNS)
    found = decide(view(_mine(SERVER_INODE), me, listening=_desk_sockets()), PORT)
    assert found.runners == [] and "held by another process than the runner" in (found.problem or "")


def test_a_runner_of_another_users_other_ollama_is_never_adopted() -> None:
    # Port 11434 is held by uid 999; the runner's parent runs as uid 998: another Ollama.
    sockets = [listen(PORT, OLLAMA_UID, SERVER_INODE), listen(RUNNER_PORT, 998, RUNNER_INODE)]
    found = decide(view(serve(uid=998), runner(uid=998), listening=sockets), PORT)
    assert found.runners == [] and found.problem is not None
    assert "127.0.0.1:11434 is held by" in found.problem and "another Ollama" in found.problem
    # A sim whose command line names another port.
    sim = ProcInfo(100, 1, OLLAMA_UID, "python3", ("python3", "-m", "sim", "--port", "11500"))
    found = decide(view(sim, runner()), PORT)
    assert found.runners == [] and "serves port 11500: another Ollama" in (found.problem or "")
    # A parent that is no Ollama server at all.
    bash = ProcInfo(100, 1, OLLAMA_UID, "bash", ("bash",))
    assert decide(view(bash, runner()), PORT).runners == []


def test_two_ollama_servers_of_one_user_are_not_guessed_between() -> None:
    found = decide(view(serve(100), serve(101), runner()), PORT)
    assert found.runners == [] and "2 Ollama servers run as" in (found.problem or "")
    assert "sudo -u" in (found.problem or "")  # with what to do
    # A second server whose command line names another port is no rival.
    other_sim = ProcInfo(101, 1, OLLAMA_UID, "python3", ("python3", "-m", "sim", "--port", "11500"))
    assert [r.pid for r in decide(view(serve(100), other_sim, runner()), PORT).runners] == [200]


def test_a_runner_in_another_network_namespace_is_explained() -> None:
    # Its port does not listen in ours (Docker): the container's socket table is not ours.
    found = decide(view(serve(uid=0), runner(uid=0), listening=[listen(PORT, 0, SERVER_INODE)]), PORT)
    assert found.runners == [] and "does not listen in this network namespace" in (found.problem or "")
    # Where the namespace link can be read (root, or our own process), it is compared.
    inside = ProcInfo(200, 100, 0, "llama-server", _runner_argv(), netns="net:[4026532999]")
    found = decide(view(serve(uid=0), inside, listening=[listen(PORT, 0, SERVER_INODE)]), PORT)
    assert found.runners == [] and "another network namespace" in (found.problem or "")
    assert "--network container:" in (found.problem or "")


def test_docker_proxy_on_the_port_says_ollama_is_in_a_container() -> None:
    proxy = ProcInfo(
        50,
        1,
        0,
        "docker-proxy",
        (
            "/usr/bin/docker-proxy",
            "-proto",
            "tcp",
            "-host-ip",
            "0.0.0.0",
            "-host-port",
            "11434",
            "-container-ip",
            "172.17.0.2",
            "-container-port",
            "11434",
        ),
    )
    found = decide(view(proxy, listening=[listen(PORT, 0, SERVER_INODE, "0.0.0.0")]), PORT)
    assert found.runners == [] and "docker-proxy to a container (172.17.0.2:11434)" in (found.problem or "")


def test_hidepid_is_named_with_what_to_do() -> None:
    found = decide(view(hidepid="2", others_visible=False), PORT)
    assert found.runners == [] and found.problem is not None
    assert found.problem.startswith("no runner process here") and "hidepid=2" in found.problem
    assert "gid=" in found.problem
    # Visible other users' processes: hidepid is not why.
    assert "hidepid" not in (decide(view(hidepid="1"), PORT).problem or "")


def test_an_unreadable_socket_table_is_said_with_what_to_do() -> None:
    hv = HostView(
        {100: serve(), 200: runner()},
        None,
        my_netns=NETNS,
        runners=[r for r in [runner_from_argv(200, "llama-server", _runner_argv())] if r],
    )
    found = decide(hv, PORT)
    assert found.runners == [] and "/proc/net/tcp" in (found.problem or "") and "sudo -u" in (found.problem or "")


def test_our_own_ollama_in_a_container_is_not_called_another_ollama() -> None:
    # Rootless Podman: our own processes, but the runner's sockets are in the container's namespace.
    mine = ProcInfo(100, 1, DESK_UID, "ollama", ("ollama", "serve"), sockets=frozenset(), netns="net:[4026532777]")
    inside = ProcInfo(200, 100, DESK_UID, "llama-server", _runner_argv(), netns="net:[4026532777]")
    found = decide(view(mine, inside), PORT)
    assert found.runners == [] and found.container and "another network namespace" in (found.problem or "")


def test_localhost_means_both_loopback_addresses_and_both_must_be_ollamas() -> None:
    """``localhost`` may reach 127.0.0.1 or ::1: another user listening on the other one makes the server unknown."""
    both = (LOOPBACK, ipaddress.ip_address("::1"))
    sockets = [listen(PORT, OLLAMA_UID, SERVER_INODE), listen(RUNNER_PORT, OLLAMA_UID, RUNNER_INODE)]
    assert [r.pid for r in decide(view(serve(), runner(), listening=sockets), PORT, both).runners] == [200]
    squatter = listen(PORT, DESK_UID, 7003, "::1")
    found = decide(view(serve(), runner(), listening=[*sockets, squatter]), PORT, both)
    assert found.runners == [] and "127.0.0.1:11434 or [::1]:11434 is held by" in (found.problem or "")


def test_no_runner_is_told_beside_what_api_ps_lists() -> None:
    hint = "; /proc is mounted with hidepid=2: ..."
    assert with_loaded_models(NO_RUNNER + hint, None, simulated=False) == NO_RUNNER + hint  # /api/ps not known
    assert with_loaded_models(NO_RUNNER, [], simulated=False) == "no runner process here (no model is loaded)"
    told = with_loaded_models(NO_RUNNER + hint, ["a", "b", "c", "d", "e"], simulated=False)
    assert told.startswith("no runner process here, though Ollama's /api/ps lists a, b, c and 2 more as loaded")
    assert told.endswith(hint)  # what to do stays
    assert "simulator" in with_loaded_models(NO_RUNNER, ["a"], simulated=True)
    other = "2 runner(s) here, none of the Ollama on 127.0.0.1:11434: ..."
    assert with_loaded_models(other, ["a"], simulated=False) == other  # runners seen: their reasons say it
