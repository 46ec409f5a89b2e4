"""``python -m collectors``: the recording proxy, the Ollama poller and the samplers, until stopped.

Exit codes: 0 after Ctrl-C or SIGTERM (everything written); 2 for a wrong setting (one
line on stderr says what and what to do); 3 when another collector already holds the
data folder (the line names its process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from collectors.config import Settings, SettingsError, load_settings
from collectors.lock import LockHeldError
from collectors.proxy import run_with_best_loop
from collectors.service import CollectorService, StoreOpenError

EXIT_OK = 0
EXIT_SETTINGS = 2
EXIT_ALREADY_RUNNING = 3


async def _run(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await CollectorService(settings).run_until(stop)


def main(argv: Sequence[str] | None = None) -> int:
    prog = "phasewatch collector"
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        run_with_best_loop(_run(settings))
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    except StoreOpenError as exc:
        print(f"{prog}: {exc}; choose another --data folder or move that file away", file=sys.stderr)
        return EXIT_SETTINGS
    except LockHeldError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ALREADY_RUNNING
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
