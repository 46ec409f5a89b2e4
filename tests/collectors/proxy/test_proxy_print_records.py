"""``python -m collectors.proxy --print-records`` prints each record as ``dataclasses.asdict`` JSON; tests that run the
proxy in its own process (tests/support/proxy_process.py, ProxyChild) read those lines back as records."""

from __future__ import annotations

import dataclasses
import json

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from tests.support.proxy_process import record_from_json


def test_a_printed_record_reads_back_equal_with_its_enums_and_metrics() -> None:
    record = RequestRecord(
        id="a" * 32,
        started_at_unix_s=1.5,
        client_addr="127.0.0.1",
        endpoint="/api/embed",
        model="m:1b",
        stream=False,
        kind=RequestKind.EMBED,
        token_chunk_ns=[3, 4],
        outcome=Outcome.HTTP_ERROR,
        metrics=FinalMetrics(total_duration_ns=7, done_reason="stop"),
        seen_from=SeenFrom.RUNNER,
    )
    back = record_from_json(json.loads(json.dumps(dataclasses.asdict(record))))
    assert back == record
    assert type(back.metrics) is FinalMetrics and type(back.outcome) is Outcome and type(back.kind) is RequestKind
    assert type(back.seen_from) is SeenFrom
    assert record_from_json(json.loads(json.dumps(dataclasses.asdict(dataclasses.replace(record, metrics=None))))).metrics is None
