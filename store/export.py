"""Export recorded requests, one row each with its phases and rates, as JSON lines or CSV.

Each row carries the phases stored with the request (``analysis.phases`` at write time),
under exactly the keys of ``python -m analysis.phases``, plus what only the proxy knows
(id, model, endpoint, kind, stream, outcome, client timings, thinking apart from the answer) and where each
phase's value came from (``*_source``: ollama, usage, stream, counted, slots, log, estimate; empty where the
value is not known — an unknown value is empty, never 0).

Times: ``started_at`` is UTC in ISO 8601 with its zone (``2026-12-07T02:54:29.123+00:00``), beside
``started_at_unix_s``. The Requests page's Download CSV is this export, of the page's window and filters
(``csv_text``); ``python -m store export --since ... --until ...`` gives the same file (the times: analysis/command_line.py).

``seen_from``: ``proxy``, or ``runner`` for a generation a client sent Ollama directly, recorded from its
runner: ``runner_source`` says whether its figures are the runner's own timings from Ollama's log (exact) or
readings of its /slots, and the ``*_bound`` columns how far each value can be off; its route, client and
``stream`` are empty where they are not known, and ``client_unverified`` is true where they came from Ollama's
access line (text in its log, not a socket the collector saw).

Which program sent it: ``client_program`` and ``client_program_version``, its User-Agent's first product and
version; ``client_process``, ``client_pid`` and ``client_user``, the local process behind a loopback client's socket
where the OS showed it. Each is empty where not known.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from analysis.phases import CLI_KEYS
from store.queries import stored_requests

# Columns in the order written; the phase keys are those of `python -m analysis.phases`.
EXPORT_KEYS: tuple[str, ...] = (
    "id",
    "started_at",
    "started_at_unix_s",
    "model",
    "endpoint",
    "kind",
    "stream",
    "batch_size",
    "client_addr",
    "client_program",
    "client_program_version",
    "client_process",
    "client_pid",
    "client_user",
    "status",
    "status_code",
    "error",
    *CLI_KEYS,
    "ttft_s",
    "server_ttft_s",
    "ttfa_s",
    "transport_s",
    "client_s",
    "itl_p50_ms",
    "itl_p99_ms",
    "itl_max_ms",
    "token_chunks",
    "thinking_tokens",
    "thinking_s",
    "thinking_tok_s",
    "answer_tokens",
    "answer_s",
    "answer_tok_s",
    "load_source",
    "queue_source",
    "prefill_source",
    "decode_source",
    "prompt_tokens_source",
    "output_tokens_source",
    "thinking_source",
    "seen_from",
    "runner_source",
    "runner_port",
    "runner_task_id",
    "ends_bound_s",
    "prefill_bound_s",
    "decode_bound_s",
    "output_tokens_bound",
    "client_unverified",
)

# OWASP ASVS (5.3 / 1.2.10) on CSV injection: a text cell starting with one of these is escaped with a leading "'".
# NUL is on its list: LibreOffice Calc drops a leading NUL on import and then runs "\x00=1+1" as a formula.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\x00")
# A formula sign after leading whitespace or control characters (spaces, NUL, LF, no-break space...): a
# spreadsheet that trims or drops those on import sees the formula, so such a cell is escaped too.
_FORMULA_AFTER_BLANKS = re.compile(r"[\s\x00-\x1f\x7f]*[=+\-@]")
# RFC 4180's line end; with CR in it the csv module also quotes a cell that holds a lone CR.
CSV_LINE_END = "\r\n"


@dataclass(frozen=True)
class ExportWindow:
    """Which requests an export holds: started in [since, until] (Unix seconds; None: no end), matching the
    filters (None: any). The Requests page's download and ``python -m store export`` take the same one."""

    since_unix_s: float = 0.0
    until_unix_s: float | None = None
    model: str | None = None
    endpoint: str | None = None
    outcome: str | None = None
    program: str | None = None  # the User-Agent's product (client_program)


def export_rows(conn: sqlite3.Connection, window: ExportWindow | float = 0.0) -> Iterator[dict[str, Any]]:
    """One dict per request of the window (a bare number: started since then), oldest first."""
    w = window if isinstance(window, ExportWindow) else ExportWindow(since_unix_s=window)
    for stored in stored_requests(conn, w.since_unix_s, w.until_unix_s, w.model, w.endpoint, w.outcome, w.program):
        rec = stored.record
        phases = stored.phases.to_json_dict()
        out: dict[str, Any] = {
            "id": rec.id,
            "started_at": datetime.fromtimestamp(rec.started_at_unix_s, UTC).isoformat(timespec="milliseconds"),
            "started_at_unix_s": rec.started_at_unix_s,
            "model": rec.model,
            "endpoint": rec.endpoint,
            "kind": str(rec.kind),
            "stream": rec.stream,
            "batch_size": rec.batch_size,
            "client_addr": rec.client_addr,
            "client_program": rec.client_program,
            "client_program_version": rec.client_program_version,
            "client_process": rec.client_process,
            "client_pid": rec.client_pid,
            "client_user": rec.client_user,
            "status": rec.outcome.value,
            "status_code": rec.status_code,
            "error": rec.error,
            "seen_from": str(rec.seen_from),
            "runner_source": rec.runner_source,
            "runner_port": rec.runner_port,
            "runner_task_id": rec.runner_task_id,
            "ends_bound_s": rec.ends_bound_s,
            "prefill_bound_s": rec.prefill_bound_s,
            "decode_bound_s": rec.decode_bound_s,
            "output_tokens_bound": rec.output_tokens_bound,
            "client_unverified": rec.client_unverified,
        }
        for key in EXPORT_KEYS:
            if key not in out:
                value = phases[key]
                out[key] = str(value) if key.endswith("_source") and value is not None else value
        yield {key: out[key] for key in EXPORT_KEYS}  # JSON lines keep the CSV's column order


def write_jsonl(rows: Iterator[dict[str, Any]], out: TextIO) -> int:
    n = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        n += 1
    return n


def csv_cell(value: Any) -> Any:
    """A value made safe for a spreadsheet: text that would start a formula gets a leading ``'``.

    That is text starting with one of ``FORMULA_PREFIXES``, or with ``=``, ``+``, ``-`` or ``@`` after leading
    whitespace or control characters. Only text is touched: numbers (negative ones too) stay numbers. Used
    by the export and by the Requests page's download, so both escape alike.
    """
    if isinstance(value, str) and (value.startswith(FORMULA_PREFIXES) or _FORMULA_AFTER_BLANKS.match(value)):
        return "'" + value
    return value


def write_csv(rows: Iterator[dict[str, Any]], out: TextIO) -> int:
    """CSV with a header; lists and dicts (flags) as JSON text, absent values empty, formulas escaped."""
    writer = csv.DictWriter(out, fieldnames=list(EXPORT_KEYS), lineterminator=CSV_LINE_END)
    writer.writeheader()
    n = 0
    for row in rows:
        writer.writerow(
            {k: csv_cell(json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else v) for k, v in row.items()}
        )
        n += 1
    return n


def csv_text(conn: sqlite3.Connection | None, window: ExportWindow) -> str:
    """The export of ``window`` as CSV text: what the Requests page's Download CSV gives (the same file as
    ``python -m store export --format csv`` with the same window); the header alone where there is no store."""
    out = io.StringIO(newline="")
    write_csv(export_rows(conn, window) if conn is not None else iter(()), out)
    return out.getvalue()
