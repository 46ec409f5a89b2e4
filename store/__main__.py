"""``python -m store export --data DIR --format jsonl|csv [--since ...] [--out FILE]``.

``python -m store import-log --data DIR FILE`` runs ``python -m collectors.import_log`` with the same arguments, as
a child process: reading Ollama's log is the collectors' work, and the store imports nothing above ``analysis``
(docs/import-log.md)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from analysis.command_line import ExitCode, add_window_arguments
from analysis.records import Outcome
from store.export import ExportWindow, export_rows, write_csv, write_jsonl
from store.queries import open_readonly
from store.schema import StoreError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m store", description="Phasewatch store tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="one row per recorded request with its phases and rates")
    export.add_argument(
        "--data",
        metavar="DIR",
        default=os.environ.get("PHASEWATCH_DATA"),
        help="data folder holding phasewatch.sqlite3 (default $PHASEWATCH_DATA)",
    )
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    add_window_arguments(export)
    # The Requests page's filters, so that its Download CSV can be made here too.
    export.add_argument("--model", help="only this model (as the request named it)")
    export.add_argument("--endpoint", help="only this route, e.g. /api/chat")
    export.add_argument("--outcome", help="only this outcome: ok, http_error, client_disconnected, ...")
    export.add_argument("--program", help="only this program, as its User-Agent named it (client_program), e.g. ollama-python")
    export.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    sub.add_parser("import-log", help="record the generations an Ollama log holds (python -m collectors.import_log)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["import-log"]:
        # A child process, not an import: the store's layer stays below the collectors' (pyproject's contracts).
        return subprocess.run([sys.executable, "-m", "collectors.import_log", *argv[1:]], check=False).returncode
    args = build_parser().parse_args(argv)
    if not args.data:
        print("error: say where the store is: --data DIR (or set PHASEWATCH_DATA)", file=sys.stderr)
        return ExitCode.USAGE
    data = Path(args.data)
    if not data.is_dir():
        print(f"error: {data} is not a folder", file=sys.stderr)
        return ExitCode.USAGE
    try:
        now = time.time()
        window = ExportWindow(
            since_unix_s=args.since.at(now) if args.since else 0.0,
            until_unix_s=args.until.at(now) if args.until else None,
            model=args.model,
            endpoint=args.endpoint,
            outcome=Outcome(args.outcome).value if args.outcome else None,
            program=args.program,
        )
        conn = open_readonly(data)
    except (ValueError, StoreError) as exc:  # an unknown --outcome, no store in the folder
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    write = write_jsonl if args.format == "jsonl" else write_csv
    try:
        if args.out:
            # Write beside the target and rename, so a failed export never leaves half a file.
            out_path = Path(args.out)
            tmp = out_path.with_name(f".{out_path.name}.partial")
            try:
                with tmp.open("w", encoding="utf-8", newline="") as f:
                    n = write(export_rows(conn, window), f)
                tmp.replace(out_path)
            finally:
                tmp.unlink(missing_ok=True)
            print(f"wrote {n} requests to {out_path}", file=sys.stderr)
        else:
            write(export_rows(conn, window), sys.stdout)
    except BrokenPipeError:  # e.g. `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except OSError as exc:  # the output could not be written (disk full, no such folder)
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        conn.close()
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
