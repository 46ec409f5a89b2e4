"""Discovery's judgement over what an unprivileged user sees: a fake /proc for the socket table and mount
options (as Linux writes them), and process views as psutil gives them for another user's processes (command
line, parent and owner readable; sockets not). The real two-user case: test_discovery_two_users.py."""

from __future__ import annotations

from pathlib import Path

from collectors.ollama.discovery import (
    FOUND_OTHER_USER,
    FOUND_SAME_USER,
    HostView,
    ProcInfo,
    decide,
    listening_sockets,
    proc_hidepid,
    runner_from_argv,
)

OLLAMA_UID, DESK_UID = 999, 1000
PORT = 11434
RUNNER_PORT = 43841
NETNS = "net:[4026531840]"

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
    assert listening_sockets(root) == {PORT: {OLLAMA_UID}, RUNNER_PORT: {OLLAMA_UID}, 8080: {DESK_UID}}
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


def view(
    *procs: ProcInfo,
    listening: dict[int, frozenset[int]] | None = None,
    hidepid: str | None = None,
    others_visible: bool = True,
) -> HostView:
    by_pid = {p.pid: p for p in procs}
    runners = [r for p in procs if (r := runner_from_argv(p.pid, p.name, p.argv)) is not None]
    if listening is None:
        listening = {PORT: frozenset({OLLAMA_UID}), RUNNER_PORT: frozenset({OLLAMA_UID})}
    return HostView(by_pid, listening, my_netns=NETNS, hidepid=hidepid, other_users_visible=others_visible, runners=runners)


def serve(pid: int = 100, uid: int = OLLAMA_UID, argv: tuple[str, ...] = ("/usr/local/bin/ollama", "serve")) -> ProcInfo:
    return ProcInfo(pid, 1, uid, "ollama", argv)  # another user's: listens and netns unreadable (None)


def runner(pid: int = 200, ppid: int = 100, port: int = RUNNER_PORT, uid: int = OLLAMA_UID) -> ProcInfo:
    return ProcInfo(pid, ppid, uid, "llama-server", _runner_argv(port))


def test_another_users_ollama_runner_is_found_by_command_line_and_sockets() -> None:
    found = decide(view(serve(), runner()), PORT)
    assert [r.pid for r in found.runners] == [200] and found.problem is None
    assert found.found_by == FOUND_OTHER_USER


def test_our_own_ollama_is_found_by_process() -> None:
    mine = ProcInfo(100, 1, DESK_UID, "ollama", ("ollama", "serve"), listens=frozenset({PORT}), netns=NETNS)
    found = decide(view(mine, runner(uid=DESK_UID)), PORT)
    assert [r.pid for r in found.runners] == [200] and found.found_by == FOUND_SAME_USER


def test_a_runner_of_our_own_other_ollama_is_not_adopted() -> None:
    mine = ProcInfo(100, 1, DESK_UID, "ollama", ("ollama", "serve"), listens=frozenset({11500}), netns=NETNS)
    found = decide(view(mine, runner(uid=DESK_UID)), PORT)
    assert found.runners == [] and found.problem is not None and "does not listen on port 11434" in found.problem


def test_a_runner_of_another_users_other_ollama_is_never_adopted() -> None:
    # Port 11434 is held by uid 999; the runner's parent runs as uid 998: another Ollama.
    found = decide(
        view(serve(uid=998), runner(uid=998)),
        PORT,
    )
    assert found.runners == [] and found.problem is not None
    assert "port 11434 is held by" in found.problem and "another Ollama" in found.problem
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
    found = decide(view(serve(uid=0), runner(uid=0), listening={PORT: frozenset({0})}), PORT)
    assert found.runners == [] and "does not listen in this network namespace" in (found.problem or "")
    # Where the namespace link can be read (root, or our own process), it is compared.
    inside = ProcInfo(200, 100, 0, "llama-server", _runner_argv(), netns="net:[4026532999]")
    found = decide(view(serve(uid=0), inside), PORT)
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
    found = decide(view(proxy, listening={PORT: frozenset({0})}), PORT)
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
    mine = ProcInfo(100, 1, DESK_UID, "ollama", ("ollama", "serve"), listens=frozenset(), netns="net:[4026532777]")
    inside = ProcInfo(200, 100, DESK_UID, "llama-server", _runner_argv(), netns="net:[4026532777]")
    found = decide(view(mine, inside), PORT)
    assert found.runners == [] and found.container and "another network namespace" in (found.problem or "")
