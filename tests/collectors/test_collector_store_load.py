"""The store under load from a real collector in front of sim: the size bound holds, a kill -9 loses little.

Each test runs ``python -m collectors`` as a subprocess over ``python -m sim`` and drives it with a few
concurrent clients for a bounded time (helpers: ``tests.support.collector_process``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

from store.schema import db_path
from tests.support.collector_process import collector, drive, listen_url, query, stop
from tests.support.sim_process import start_sim

MIB = 1024 * 1024
BOUND_MB = 1
LOAD_S = 30.0  # the load's length: ~15x the time the unbounded store took to pass 2 MB here
START_GRACE_S = 0.0  # none needed: the bound is checked after every commit from the first one


def files_bytes(data: Path) -> int:
    """The store's size on disk: the main file and its -wal (the -shm is a fixed-size index)."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{db_path(data)}{suffix}").st_size
    return total


class SizeSampler:
    """Samples the store's size every 50 ms on a thread, from start() to stop()."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.samples: list[tuple[float, int]] = []  # (monotonic s, bytes)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic(), files_bytes(self.data)))
            self._halt.wait(0.05)

    def __enter__(self) -> SizeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(5)

    def peak(self, after_s: float = 0.0) -> int:
        t0 = self.samples[0][0]
        return max(b for t, b in self.samples if t - t0 >= after_s)


@pytest.mark.slow
def test_max_db_mb_holds_under_load_and_after_a_restart(tmp_path: Path) -> None:
    bound = BOUND_MB * MIB
    with start_sim("--hardware", "rtx-4090", "--num-parallel", "4") as sim:
        with collector(tmp_path, "--ollama", sim.base_url, "--record-text", "--max-db-mb", str(BOUND_MB)) as proc:
            with SizeSampler(tmp_path) as sizes:
                answered = drive(listen_url(tmp_path), LOAD_S, clients=4, on_answer=lambda p: None)
            code, err = stop(proc)
            assert code == 0, err
        stored = query(tmp_path, "SELECT COUNT(*) AS n, MAX(started_at_unix_s) AS newest FROM requests")[0]
        row_bytes = files_bytes(tmp_path) / max(1, stored["n"])
        # The load wrote far more than the bound (else the test proves nothing)...
        assert answered * row_bytes > 4 * bound, (answered, row_bytes)
        # ...and the files stayed within twice the bound all along, the newest requests kept.
        t0 = sizes.samples[0][0]
        big = [(round(t - t0, 2), round(b / MIB, 2)) for t, b in sizes.samples if b > 2 * bound][:20]
        assert sizes.peak(after_s=START_GRACE_S) <= 2 * bound, f"peak {sizes.peak() / MIB:.2f} MiB; over: {big}"
        assert 0 < stored["n"] < answered and stored["newest"] > time.time() - 60

        # A restart on the same folder: still within the bound.
        with collector(tmp_path, "--ollama", sim.base_url, "--max-db-mb", str(BOUND_MB)) as again:
            with SizeSampler(tmp_path) as after:
                drive(listen_url(tmp_path), 3.0, clients=2, on_answer=lambda p: None)
            code, err = stop(again)
            assert code == 0, err
        assert after.peak() <= 2 * bound, f"peak after restart {after.peak() / MIB:.2f} MiB"
        assert files_bytes(tmp_path) <= 2 * bound
    print(f"answered {answered}, peak {sizes.peak() / MIB:.2f} MiB, after restart {after.peak() / MIB:.2f} MiB")
