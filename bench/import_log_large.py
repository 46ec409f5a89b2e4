"""Import a large Ollama log: time, peak memory and progress of ``python -m collectors.import_log``.

Writes a log of ``--mb`` megabytes by repeating the H200 run's log (tests/data/real_gpu_h200/ollama.log: a runner
start, its load lines, 13 generations with their access lines) with every ``time=`` and ``[GIN]`` stamp shifted
past the previous copy's, then imports it into an empty data folder in a child process, and again into the same
folder (every generation already there), and prints each child's wall time, the peak resident memory of the
children (getrusage), the progress lines printed and the summary.

    .venv/bin/python bench/import_log_large.py --mb 100
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "tests" / "data" / "real_gpu_h200" / "ollama.log"
SLOG = re.compile(rb"^time=(\S+) ")
GIN = re.compile(rb"^\[GIN\] (\d{4}/\d\d/\d\d - \d\d:\d\d:\d\d) ")


def shifted(line: bytes, by: timedelta) -> bytes:
    m = SLOG.match(line)
    if m:
        when = datetime.fromisoformat(m.group(1).decode()) + by
        return b"time=" + when.isoformat(timespec="milliseconds").encode() + line[m.end(1) :]
    m = GIN.match(line)
    if m:
        when = datetime.strptime(m.group(1).decode(), "%Y/%m/%d - %H:%M:%S") + by
        return b"[GIN] " + when.strftime("%Y/%m/%d - %H:%M:%S").encode() + line[m.end(1) :]
    return line


def write_log(path: Path, target_bytes: int) -> int:
    lines = SOURCE.read_bytes().splitlines(keepends=True)
    span = timedelta(minutes=2)  # the run took 72 s: each copy starts two minutes after the previous one
    copies = 0
    with path.open("wb") as f:
        while f.tell() < target_bytes:
            by = span * copies
            f.writelines(shifted(line, by) for line in lines)
            copies += 1
    return copies


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        copies = write_log(log, int(args.mb * 1e6))
        print(f"log: {log.stat().st_size / 1e6:.1f} MB, {copies} copies of the H200 run ({copies * 13} generations)")
        for attempt in ("into an empty store", "again (every generation already there)"):
            t0 = time.monotonic()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(
                [sys.executable, "-m", "collectors.import_log", "--data", str(Path(tmp) / "data"), str(log)],
                cwd=REPO,
                capture_output=True,
                check=False,
            )
            wall_s = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # less shaken by other load
            peak_mib = after.ru_maxrss / 1024  # the largest child so far
            progress = [p for p in out.stderr.decode().split("\r") if p.strip()]
            print(f"{attempt}: exit {out.returncode}; wall {wall_s:.1f} s, CPU {cpu_s:.1f} s; peak RSS {peak_mib:.0f} MiB")
            if progress:
                print(f"  progress: {len(progress)} updates, first {progress[0].strip()!r}, last {progress[-1].strip()!r}")
            print("  " + out.stdout.decode().strip())


if __name__ == "__main__":
    main()
