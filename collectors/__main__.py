"""``python -m collectors``: the recording proxy, the Ollama poller and the samplers, until stopped.

Exit codes: 0 after Ctrl-C, SIGTERM or ``--stop`` (everything written); 1 when the store would not
take every record before closing (disk full, say); 2 for a wrong setting (one line on
stderr says what and what to do); 3 when another collector already holds the data
folder (the line names its process).

``--stop`` stops the collector that records into the data folder instead, through a stop file it
watches (no signal: the same on every OS; exit 0 once it is gone or when none ran, 1 if it would not
stop). ``--exit-with-parent`` (how the dashboard
starts its collector) stops this one when the process that started it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from analysis.command_line import ExitCode
from collectors.config import Settings, SettingsError, load_settings
from collectors.lock import LockHeldError
from collectors.proxy.limits import raise_fd_limit
from collectors.stopping import STOP_FILE, follow_parent, on_stop_signals, stop_collector, watch_stop_file

# The exit codes every command shares (analysis/command_line.py), by what they mean here.
EXIT_OK = ExitCode.OK
EXIT_UNWRITTEN = ExitCode.FAILED
EXIT_SETTINGS = ExitCode.USAGE
EXIT_ALREADY_RUNNING = ExitCode.BUSY
# How long a worker thread (the store writer, discovery, samplers) may keep the GIL while the event loop that relays
# every proxied chunk waits for it: Python's default is 5 ms, which a chunk waiting on a busy writer adds to its
# delay (bench/README.md, what the collector costs per chunk).
LOOP_GIL_WAIT_S = 0.0005

if TYPE_CHECKING:
    from collectors.service import CollectorService


async def _run(settings: Settings) -> CollectorService:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_stop_signals(loop, stop.set)

    def from_thread() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: stopping already
            loop.call_soon_threadsafe(stop.set)

    watch_stop_file(settings.data_dir / STOP_FILE, from_thread)
    if settings.exit_with_parent:
        follow_parent(from_thread)
    from collectors.service import CollectorService

    service = CollectorService(settings)
    await service.run_until(stop)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    prog = "phasewatch collector"
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    if settings.stop:
        return _stop(prog, settings)
    # Imported only to run: ``--stop`` starts in a third of the time without them (0.7 s against 2.7 s measured on
    # the shared 2-core machine), which the 10 s a stop is given counts.
    from collectors.proxy.recording import run_with_best_loop
    from collectors.service import StoreOpenError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    raise_fd_limit()  # desktops often start at 1024 descriptors; every proxied request holds two
    sys.setswitchinterval(LOOP_GIL_WAIT_S)
    try:
        service = run_with_best_loop(_run(settings))
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    except StoreOpenError as exc:
        print(f"{prog}: {exc}; choose another --data folder or move that file away", file=sys.stderr)
        return EXIT_SETTINGS
    except LockHeldError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ALREADY_RUNNING
    if service.unwritten_records:
        print(
            f"{prog}: {service.unwritten_records} records could not be written to the store: {service.unwritten_error}",
            file=sys.stderr,
        )
        return EXIT_UNWRITTEN
    return EXIT_OK


def _stop(prog: str, settings: Settings) -> int:
    stopped = stop_collector(settings.data_dir)
    if stopped is None:
        print(f"{prog}: no collector records into {settings.data_dir}")
        return EXIT_OK
    if stopped:
        print(f"{prog}: stopped the collector of {settings.data_dir}")
        return EXIT_OK
    print(f"{prog}: the collector of {settings.data_dir} did not stop", file=sys.stderr)
    return EXIT_UNWRITTEN


if __name__ == "__main__":
    sys.exit(main())
