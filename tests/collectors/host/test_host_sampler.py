"""Host sampler against the real machine: real processes, real disk reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from collectors.host.sampler import HostSampler, OllamaProcesses, is_ollama_process, is_sim_process
from tests.support.waiting import wait_until

BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 60: pass\n"
IDLE = "import time\ntime.sleep(60)\n"
SLEEPERS = 20  # processes that certainly exist before a scan


@pytest.fixture
def named_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose name is "ollama": Python started through a link of that name."""
    link = tmp_path / "ollama"
    link.symlink_to(sys.executable)
    proc = subprocess.Popen([str(link), "-c", IDLE])
    try:
        wait_until(lambda: psutil.Process(proc.pid).name() == "ollama")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_names_that_count_as_ollama() -> None:
    for name in ("ollama", "llama-server", "ollama_llama_server", "ollama_llama_se", "ollama.exe", "llama-server.EXE"):
        assert is_ollama_process(name)
    for name in ("python", "ollama-webui", "llama", ""):
        assert not is_ollama_process(name)
    assert is_sim_process(["/venv/bin/python", "-m", "sim", "--port", "0"])
    assert not is_sim_process(["/venv/bin/python", "-m", "simulator"])
    assert not is_sim_process(["bash", "-m", "sim"])
    assert not is_sim_process([])


def test_finds_ollama_by_name(named_process: subprocess.Popen[bytes]) -> None:
    procs = OllamaProcesses()
    assert named_process.pid in procs.pids()
    assert os.getpid() not in procs.pids()


def test_a_process_that_exits_is_dropped_at_once(named_process: subprocess.Popen[bytes]) -> None:
    procs = OllamaProcesses(rescan_s=3600)  # only the "a known process has gone" rule can notice
    assert named_process.pid in procs.pids()
    named_process.kill()
    named_process.wait(timeout=10)
    assert named_process.pid not in procs.pids()


def test_machine_figures_are_plausible() -> None:
    sampler = HostSampler(OllamaProcesses(pids=[os.getpid()]), clock=lambda: 42.0)
    time.sleep(0.2)
    s = sampler.sample()
    mem = psutil.virtual_memory()
    assert s.ts_unix_s == 42.0
    assert 0.0 <= s.cpu_pct <= 100.0
    assert s.mem_total_bytes == mem.total
    assert 0 < s.mem_used_bytes < s.mem_total_bytes
    assert s.ollama_rss_bytes is not None and s.ollama_rss_bytes > 10 * 2**20  # this Python process


def test_ollama_cpu_and_rss_follow_the_given_pids() -> None:
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    idle = subprocess.Popen([sys.executable, "-c", IDLE])
    try:
        busy_sampler = HostSampler(OllamaProcesses(pids=[busy.pid]))
        idle_sampler = HostSampler(OllamaProcesses(pids=[idle.pid]))
        time.sleep(1.0)
        b, i = busy_sampler.sample(), idle_sampler.sample()
        assert b.ollama_cpu_pct is not None and i.ollama_cpu_pct is not None
        # Spinning against sleeping, side by side: on a busy 2-core machine the spinner may get only a small
        # share of a core (load average 16: ~6% of the machine), so the floor is low and the ratio large.
        assert b.ollama_cpu_pct > 1.0
        assert b.ollama_cpu_pct > 10 * i.ollama_cpu_pct
        assert b.ollama_rss_bytes == pytest.approx(psutil.Process(busy.pid).memory_info().rss, rel=0.2)
        busy.kill()
        busy.wait(timeout=10)
        after = busy_sampler.sample()  # the process is gone: no exception, no figure
        assert after.ollama_cpu_pct is None and after.ollama_rss_bytes is None
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait(timeout=10)


def test_no_ollama_running_gives_none() -> None:
    sampler = HostSampler(OllamaProcesses(pids=[2**22 + 12345]))  # beyond pid_max: never a process
    s = sampler.sample()
    assert s.ollama_cpu_pct is None and s.ollama_rss_bytes is None


def test_disk_read_rate_shows_a_cold_read(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    size = 16 * 2**20
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    sampler = HostSampler(OllamaProcesses(pids=[]))
    t0 = time.monotonic()
    sampler.sample()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop it from the page cache: the read must hit the disk
        while os.read(fd, 2**20):
            pass
    finally:
        os.close(fd)
    s = sampler.sample()
    elapsed_s = time.monotonic() - t0
    if psutil.disk_io_counters() is None:  # a machine that shows no disks
        assert s.disk_read_bytes_s is None
        return
    assert s.disk_read_bytes_s is not None
    assert s.disk_read_bytes_s * elapsed_s >= 0.9 * size


def test_a_rescan_reads_only_new_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: a rescan every 5 s read every process's name again; most processes live for hours."""
    sleepers = [subprocess.Popen([sys.executable, "-c", IDLE]) for _ in range(SLEEPERS)]  # some processes for sure
    reads: list[int] = []
    real_name = psutil.Process.name

    def counted_name(self: psutil.Process) -> str:
        reads.append(self.pid)
        return real_name(self)

    now_s = [0.0]
    watched = OllamaProcesses(rescan_s=0.0, clock=lambda: now_s[0])
    link = tmp_path / "llama-server"
    link.symlink_to(sys.executable)
    runner: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: all(psutil.Process(p.pid).name().startswith("python") for p in sleepers))
        monkeypatch.setattr(psutil.Process, "name", counted_name)
        watched.processes()
        first = len(reads)
        now_s[0] += 60.0  # every process seen has settled (execed, if it was going to)
        reads.clear()
        watched.processes()
        # Only processes started between the two scans are read (other users of a busy machine start a few).
        assert first >= SLEEPERS and len(reads) <= first // 4, (first, len(reads))
        runner = subprocess.Popen([str(link), "-c", IDLE])  # a new runner is still found at the next scan
        wait_until(lambda: real_name(psutil.Process(runner.pid)) == "llama-server")
        now_s[0] += 60.0
        assert runner.pid in {p.pid for p in watched.processes()}
    finally:
        for proc in [*sleepers, *([runner] if runner else [])]:
            proc.kill()
            proc.wait(timeout=10)
