"""The traffic the wait-split tests send (sim's roofline engine and the real llama-server alike): a long prompt
streamed and a short chat beside it, through the recording proxy; and the verdicts ``analysis.wait_split`` and
``analysis.diagnose`` give each request."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from analysis.diagnose import Diagnosis, diagnose_request
from analysis.phases import split_record
from analysis.records import RequestRecord, RunnerFlags
from analysis.runner_wait_tasks import TaskWaits, WaitKind
from analysis.wait_split import WaitSplit, split_for
from collectors.proxy.recording import RECORD_ID_HEADER
from store.ops import PutRequest, PutRunners
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.proxy_thread import ProxyThread


def send(proxy: ProxyThread, body: dict[str, Any], out: list[str]) -> None:
    """One /api/generate through the proxy; its record id appended to ``out``."""
    resp = httpx.post(proxy.base_url + "/api/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    out.append(resp.headers[RECORD_ID_HEADER])


def long_then_short(
    proxy: ProxyThread, long_body: dict[str, Any], short_body: dict[str, Any], *, gap_s: float | None
) -> tuple[RequestRecord, RequestRecord]:
    """The long request streamed, and the short one sent ``gap_s`` after it (None: after it finished)."""
    long_id: list[str] = []
    short_id: list[str] = []
    t = threading.Thread(target=send, args=(proxy, long_body, long_id))
    t.start()
    if gap_s is None:
        t.join(timeout=300)
    else:
        time.sleep(gap_s)
    send(proxy, short_body, short_id)
    t.join(timeout=300)
    return proxy.wait_record(long_id[0]), proxy.wait_record(short_id[0])


def verdicts(
    rec: RequestRecord, others: list[RequestRecord], n_slots: int, waits: TaskWaits | None = None
) -> tuple[WaitSplit, list[Diagnosis]]:
    """The split and the diagnoses; ``waits``: what the runner's lines said it did for the task before its prompt."""
    ph = split_record(rec)
    named = waits is not None and bool(waits.before_prefill())
    split = split_for(rec, ph, [(o, split_record(o)) for o in others], n_slots=n_slots, runner_named=named)
    return split, diagnose_request(rec, ph, split=split, waits=waits)


def saved_state(n_slots: int) -> TaskWaits:
    """The runner's lines for a task launched after another ended: it copied that conversation's state (20 MiB) into
    its prompt cache first, as llama-server prints for every task that takes a slot someone used."""
    waits = TaskWaits(task_id=7, slot_id=0, n_slots=n_slots, other_slots_busy=0)
    waits.add(WaitKind.PROMPT_CACHE_SAVE, 20 * 1024 * 1024, 4095)
    return waits


def codes(ds: list[Diagnosis]) -> set[str]:
    return {d.code for d in ds}


def computed_prompt(rec: RequestRecord) -> int:
    ph = split_record(rec)
    return (ph.prompt_tokens or 0) - (ph.cached_tokens or 0)


def write_store(data_dir: Path, records: list[RequestRecord], *, model: str, n_slots: int) -> Path:
    """The records as the collector writes them, beside the runner that served them (its -np), in a real SQLite
    store the pages read."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = db_path(data_dir)
    w = StoreWriter(path)
    try:
        for rec in records:
            w.write(PutRequest(rec))
        runner = RunnerFlags(
            ts_unix_s=time.time(), pid=4242, port=0, kind="llama-server", digest=None, model=model,
            ctx_size_tokens=None, parallel=n_slots, batch_tokens=None, ubatch_tokens=None, cache_type_k=None,
            cache_type_v=None, flash_attn=None, gpu_layers=None, threads=None,
        )  # fmt: skip
        w.write(PutRunners([runner]))
    finally:
        w.close()
    return path
