"""The runner's own waits through the whole collector: ``python -m sim --engine llama-server --num-parallel 2`` starts
llama.cpp's ``llama-server`` (a CPU build here) with two slots; when a new prompt takes one slot, the runner saves
the other, idle slot's conversation into its RAM prompt cache first ("saving idle slot to prompt cache", then its
size). The collector reading sim's log stores that save, with its size, for the request it preceded, and the
Requests waterfall names the time before prefill after it. On this small model the save is a few MiB and takes
milliseconds; on the H200 run's 12B model it took 1.65 s (tests/pages/requests/test_requests_runner_waits.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from collectors.proxy.recording import RECORD_ID_HEADER
from pages.requests.view import build_detail
from store import queries
from store.schema import StoreError, db_path
from tests.support.collector_process import collector, listen_url
from tests.support.engine_process import MODEL, start_server_engine, words_prompt
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]


def _generate(base_url: str, prompt: str) -> str:
    """One non-streamed generation through the proxy; the proxy's record id."""
    body = {"model": MODEL, "prompt": prompt, "stream": False, "options": {"num_predict": 4, "temperature": 0}}
    r = httpx.post(base_url + "/api/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text[:300]
    return r.headers[RECORD_ID_HEADER]


def test_an_idle_slots_prompt_cache_save_is_stored_and_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with (
        start_server_engine("--num-parallel", "2") as sim,
        collector(data, "--ollama", sim.base_url, "--ollama-log", str(sim.log_path)),
    ):

        def reading_the_log() -> object:
            conn = queries.open_readonly(db_path(data))  # raises until the collector created the store
            try:
                beat = queries.latest_heartbeat(conn)
            finally:
                conn.close()
            return beat is not None and beat.log_problem is None

        wait_until(reading_the_log, 60, "the collector reading sim's log", ignoring=(StoreError,))
        base = listen_url(data)
        ids: list[str] = []

        def a_save_stored() -> object:
            # Different prompts, one after another: each new one takes the least recently used slot, and the runner
            # saves the other slot's conversation first. The first requests also wait for the collector to find the
            # runner and join its tasks to requests through /slots.
            ids.append(_generate(base, words_prompt(300, seed=len(ids) + 1)))
            conn = queries.open_readonly(db_path(data))
            try:
                found = queries.request_waits(conn, ids)
            finally:
                conn.close()
            saved = {rid: w for rid, w in found.items() if "prompt_cache_save" in w.waits}
            return saved or None

        saved = wait_until(a_save_stored, 300, "a prompt-cache save stored for a request", interval_s=0.5)
        rid, waits = next(iter(saved.items()))

        def finished_detail() -> object:
            d = build_detail(db_path(data), rid)
            return d if d is not None and d.record.outcome.value == "ok" and d.waterfall.data else None

        d = wait_until(finished_detail, 30, "the request's finished record")
    save = waits.waits["prompt_cache_save"]
    print(f"\n{len(ids)} requests; {rid}: {save.count} save(s), {save.size_bytes / 2**20:.3f} MiB, {save.tokens} tokens")
    assert waits.n_slots == 2 and save.size_bytes > 0 and (save.tokens or 0) > 100
    names = [t.name for t in d.waterfall.data]
    print("queue", d.phases.queue_s, names)
    assert any(n.startswith("runner: prompt-cache save") and "MiB" in n for n in names), names
    assert "ttft_queue" not in [x.code for x in d.diagnoses]
