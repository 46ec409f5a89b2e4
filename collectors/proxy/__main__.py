"""``python -m collectors.proxy``: the recording proxy alone (benchmarks, debugging; the collector runs it for you)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys

from analysis.command_line import ExitCode
from analysis.records import RequestRecord
from collectors.config import SettingsError, load_limits, load_token, parse_listen
from collectors.proxy.access import split_list
from collectors.proxy.limits import raise_fd_limit
from collectors.proxy.recording import RecordingProxy, run_with_best_loop
from collectors.stopping import on_stop_signals


async def _serve(upstream: str, host: str, port: int, record_text: bool, print_records: bool, token: str | None = None) -> None:
    def on_record(record: RequestRecord) -> None:
        if print_records:
            print(json.dumps(dataclasses.asdict(record)), flush=True)

    proxy = RecordingProxy(
        upstream,
        on_record,
        record_text=record_text,
        limits=load_limits(os.environ),
        allowed_hosts=split_list(os.environ.get("PHASEWATCH_ALLOWED_HOSTS", "")),
        allowed_origins=split_list(os.environ.get("OLLAMA_ORIGINS", "").strip().strip("\"'")),
        token=token,
    )
    await proxy.start(host, port)
    print(f"listening on {host}:{proxy.port}, forwarding to {upstream}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_stop_signals(loop, stop.set)
    await stop.wait()
    await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Phasewatch's recording proxy, alone (the collector runs it for you).",
        epilog="As the collector: with PHASEWATCH_TOKEN set (required beyond loopback) every request must carry "
        "'Authorization: Bearer <token>', or gets 401 and is not recorded.",
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:11434", help="Ollama's URL")
    parser.add_argument("--listen", default="127.0.0.1:11435", help="HOST:PORT to listen on (port 0: any free one)")
    parser.add_argument("--record-text", action="store_true", help="also record prompt and response text")
    parser.add_argument("--print-records", action="store_true", help="print each record as a JSON line on stdout")
    args = parser.parse_args(argv)
    try:
        listen = parse_listen(args.listen)
        token = load_token(os.environ, listen)
    except SettingsError as exc:
        parser.error(str(exc))
    raise_fd_limit()
    run_with_best_loop(_serve(args.upstream, listen.host, listen.port, args.record_text, args.print_records, token))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
