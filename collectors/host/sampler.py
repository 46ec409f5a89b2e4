"""Host sampler (psutil): the machine's CPU and memory, Ollama's processes, disk reads.

Also finds Ollama's processes (the server and its runners) for the GPU sampler, which
needs their PIDs to tell Ollama's VRAM from everyone else's.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable

import psutil

from analysis.records import HostSample
from collectors.host.proctable import Named, ProcessNames, bare_name

# The server and its runners: ``ollama serve``, the llama.cpp ``llama-server`` child
# (Ollama >= 0.30) and the older ``ollama_llama_server`` runner. Linux truncates a
# process's comm to 15 characters, hence the prefix entry.
OLLAMA_PROCESS_NAMES = frozenset({"ollama", "llama-server", "ollama_llama_server", "ollama_llama_se"})

PROCESS_RESCAN_S = 5.0  # a full /proc scan costs milliseconds: do it now and then, not every tick


def is_ollama_process(name: str) -> bool:
    return bare_name(name) in OLLAMA_PROCESS_NAMES  # Windows: ollama.exe, llama-server.exe (any case of .exe)


def is_sim_process(cmdline: list[str]) -> bool:
    """``python -m sim ...``: the demo upstream."""
    is_python = bool(cmdline) and "python" in cmdline[0]
    return is_python and any(a == "-m" and b == "sim" for a, b in itertools.pairwise(cmdline))


class OllamaProcesses:
    """The processes that count as Ollama: by name, the sim in demo mode, or given PIDs.

    The set is rescanned every ``rescan_s`` seconds, and at once when a known process
    has gone (a runner exits when its model unloads). A rescan lists /proc and reads the
    name of new processes only (``ProcessNames``), not of every process again.
    """

    def __init__(
        self,
        *,
        pids: Iterable[int] = (),
        demo: bool = False,
        rescan_s: float = PROCESS_RESCAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fixed_pids = tuple(pids)
        self._demo = demo
        self._rescan_s = rescan_s
        self._clock = clock
        self._procs: dict[int, psutil.Process] = {}
        self._scanned_at: float | None = None
        self._names = ProcessNames(clock)  # every process's name, read once per process
        self._sims: dict[tuple[int, float], bool] = {}  # (pid, start time): a Python process is the sim

    def _matches(self, pid: int, named: Named) -> bool:
        if is_ollama_process(named.name):
            return True
        if not (self._demo and named.name.startswith("python")):
            return False
        key = (pid, named.create_time)
        if key not in self._sims:  # the command line only for Python processes, and once per process
            try:
                self._sims[key] = is_sim_process(psutil.Process(pid).cmdline())
            except psutil.Error:
                return False
        return self._sims[key]

    def _scan(self) -> None:
        found: dict[int, psutil.Process] = {}
        if self._fixed_pids:
            for pid in self._fixed_pids:
                with contextlib.suppress(psutil.Error):
                    found[pid] = self._procs.get(pid) or psutil.Process(pid)
        else:
            table = self._names.refresh()  # reads only the processes not seen before
            self._sims = {key: sim for key, sim in self._sims.items() if key[0] in table}
            for pid, named in table.items():
                if self._matches(pid, named):
                    # Keep the same Process object: cpu_percent() measures from its last call.
                    known = self._procs.get(pid)
                    with contextlib.suppress(psutil.Error):
                        same = known is not None and known.create_time() == named.create_time  # not a reused pid
                        found[pid] = known if known is not None and same else psutil.Process(pid)
        self._procs = found
        self._scanned_at = self._clock()

    def processes(self) -> list[psutil.Process]:
        """Live processes that count as Ollama; rescans when due or when one has exited."""
        now = self._clock()
        due = self._scanned_at is None or now - self._scanned_at >= self._rescan_s
        if not due and not all(p.is_running() for p in self._procs.values()):
            due = True
        if due:
            self._scan()
        return list(self._procs.values())

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes()}


class HostSampler:
    """Reads the machine and Ollama's processes; ``sample()`` never raises for a vanished process.

    CPU percentages are over the time since the previous ``sample()`` (psutil keeps the
    previous reading), so the first sample's CPU figures cover the time since construction.
    ``ollama_cpu_pct`` is summed over Ollama's processes and may exceed 100 (one core = 100).
    """

    def __init__(self, processes: OllamaProcesses, *, clock: Callable[[], float] = time.time) -> None:
        self._processes = processes
        self._clock = clock
        psutil.cpu_percent(interval=None)  # start the machine-wide CPU measurement
        for proc in processes.processes():
            with contextlib.suppress(psutil.Error):
                proc.cpu_percent(interval=None)
        self._last_disk: tuple[float, int] | None = self._disk_read_bytes()

    @staticmethod
    def _disk_read_bytes() -> tuple[float, int] | None:
        try:
            # nowrap=False: the counters are 64-bit where the rate matters, and wrapping them is psutil's dearest step
            # here (a third of the call, once a second); a counter that went back reads as no rate (below).
            counters = psutil.disk_io_counters(perdisk=False, nowrap=False)
        except (OSError, RuntimeError):
            return None
        if counters is None:  # no disks visible (some containers)
            return None
        return time.monotonic(), int(counters.read_bytes)

    def _disk_read_rate(self) -> float | None:
        now = self._disk_read_bytes()
        last, self._last_disk = self._last_disk, now
        if now is None or last is None or now[0] <= last[0]:
            return None
        if now[1] < last[1]:  # a counter wrapped or a disk went: no rate this once, never a negative one
            return None
        return (now[1] - last[1]) / (now[0] - last[0])

    def sample(self) -> HostSample:
        mem = psutil.virtual_memory()
        ollama_cpu_pct: float | None = None
        ollama_rss_bytes: int | None = None
        for proc in self._processes.processes():
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(interval=None)
                    rss = proc.memory_info().rss
            except psutil.Error:
                continue  # exited or not ours to read: leave it out
            ollama_cpu_pct = (ollama_cpu_pct or 0.0) + cpu
            ollama_rss_bytes = (ollama_rss_bytes or 0) + rss
        return HostSample(
            ts_unix_s=self._clock(),
            cpu_pct=psutil.cpu_percent(interval=None),
            mem_used_bytes=int(mem.total - mem.available),
            mem_total_bytes=int(mem.total),
            ollama_cpu_pct=ollama_cpu_pct,
            ollama_rss_bytes=ollama_rss_bytes,
            disk_read_bytes_s=self._disk_read_rate(),
        )
