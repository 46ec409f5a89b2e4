"""Loads with their cause, and Ollama's 503s at OLLAMA_MAX_QUEUE, end to end through sim and the collector.

Two clients (127.0.0.1 and 127.0.0.2) alternating num_ctx 2,048 / 4,096 reload the model each time: each
reload is recorded as "options changed" with the option, the client and its seconds, and the model is flagged
``reload_churn``. A third model over ``--max-loaded-models 2`` evicts the least recently used one, named on its
load. A request beyond ``--max-queue`` is recorded with its 503 and counted in the metrics.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from analysis.reloads import RELOAD_CHURN, Cause, Reloads, reloads
from store import queries
from store.schema import db_path
from tests.support.collector_process import collector, listen_url, query
from tests.support.sim_process import SimFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SMALL = "qwen2.5:0.5b"  # 0.40 GB: 0.4 s to load at 1 GB/s
OTHER = "qwen3:0.6b"
THIRD = "llama3.2:latest"  # 2.0 GB: 2 s at 1 GB/s


def _post(base_url: str, body: dict[str, Any], source_host: str = "127.0.0.1") -> tuple[int, Any]:
    """A generate request from ``source_host`` (any 127.x address is this machine: a second client)."""
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60, source_address=(source_host, 0))
    try:
        conn.request("POST", "/api/generate", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _gen(model: str, num_ctx: int | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"num_predict": 2}
    if num_ctx is not None:
        options["num_ctx"] = num_ctx
    return {"model": model, "prompt": "hello", "stream": False, "options": options}


def _reloads(data: Path) -> Reloads:
    with queries.open_reader(db_path(data)) as conn:
        assert conn is not None
        ps, times = queries.ps_history(conn, 0.0)
        return reloads(queries.load_inputs(conn, 0.0), ps, times)


def _stored(data: Path, n: int) -> bool:
    return len(query(data, "SELECT id FROM requests WHERE outcome != 'in_flight'")) >= n


def test_two_clients_alternating_num_ctx_are_reloads_by_options(tmp_path: Path, start_sims: SimFactory) -> None:
    sim = start_sims("--disk-gbs", "1")
    with collector(tmp_path, "--ollama", sim.base_url):
        base = listen_url(tmp_path)
        sent = [("127.0.0.1", 2048), ("127.0.0.2", 4096), ("127.0.0.1", 2048), ("127.0.0.2", 4096), ("127.0.0.1", 2048)]
        for host, ctx in sent:
            status, _ = _post(base, _gen(SMALL, ctx), host)
            assert status == 200
        wait_until(lambda: _stored(tmp_path, len(sent)), what="the five requests stored")
        result = _reloads(tmp_path)
    causes = [ld.cause for ld in result.loads]
    assert causes == [Cause.FIRST_USE] + [Cause.OPTIONS_CHANGED] * 4, result.loads
    reloads_ = result.loads[1:]
    assert [ld.option for ld in reloads_] == ["num_ctx 2,048 → 4,096", "num_ctx 4,096 → 2,048"] * 2
    assert [ld.client for ld in reloads_] == ["127.0.0.2", "127.0.0.1", "127.0.0.2", "127.0.0.1"]
    assert all(ld.load_s >= 0.3 for ld in reloads_), reloads_  # 0.4 s to read 0.40 GB at 1 GB/s
    (churn,) = result.churn
    assert churn.code == RELOAD_CHURN and churn.model == SMALL and churn.reloads == 4
    assert churn.lost_s == pytest.approx(sum(ld.load_s for ld in reloads_))
    assert churn.causes == {"options_changed": 4}
    assert "num_ctx" in churn.fix and "num_ctx 2,048 → 4,096" in churn.sentence


def test_a_third_model_over_max_loaded_models_is_an_eviction(tmp_path: Path, start_sims: SimFactory) -> None:
    sim = start_sims("--disk-gbs", "2", "--max-loaded-models", "2")
    with collector(tmp_path, "--ollama", sim.base_url):
        base = listen_url(tmp_path)
        for model in (SMALL, OTHER):
            assert _post(base, _gen(model))[0] == 200
        # The collector polls /api/ps every 0.2 s: let it see both loaded before the third comes.
        wait_until(lambda: {r["name"] for r in _latest_ps(tmp_path)} == {SMALL, OTHER}, what="both models in /api/ps")
        assert _post(base, _gen(THIRD))[0] == 200
        wait_until(lambda: {r["name"] for r in _latest_ps(tmp_path)} == {OTHER, THIRD}, what="the eviction in /api/ps")
        assert _post(base, _gen(SMALL))[0] == 200  # back again: loaded after its eviction
        wait_until(lambda: _stored(tmp_path, 4), what="the four requests stored")
        result = _reloads(tmp_path)
    by_model = [(ld.model, ld.cause) for ld in result.loads]
    assert by_model == [
        (SMALL, Cause.FIRST_USE),
        (OTHER, Cause.FIRST_USE),
        (THIRD, Cause.FIRST_USE),
        (SMALL, Cause.EVICTED),
    ], result.loads
    assert result.loads[2].evicted == (SMALL,)
    assert result.loads[3].evicted_by == THIRD


def _latest_ps(data: Path) -> list[Any]:
    return query(data, "SELECT name FROM loaded_models WHERE ts_unix_s = (SELECT MAX(ts_unix_s) FROM ps_snapshots)")


def test_a_503_at_max_queue_is_recorded_and_counted(tmp_path: Path, start_sims: SimFactory) -> None:
    sim = start_sims("--disk-gbs", "1", "--max-queue", "1")
    with collector(tmp_path, "--ollama", sim.base_url):
        base = listen_url(tmp_path)
        # THIRD loads for 2 s; OTHER waits behind it (one pending: the bound); SMALL is one too many.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(_post, base, _gen(THIRD))
            time.sleep(0.4)
            second = pool.submit(_post, base, _gen(OTHER))
            time.sleep(0.4)
            third = pool.submit(_post, base, _gen(SMALL))
            status, body = third.result()
            assert first.result()[0] == 200 and second.result()[0] == 200
        assert status == 503
        assert body == {"error": "server busy, please try again.  maximum pending requests exceeded"}
        wait_until(lambda: _stored(tmp_path, 3), what="the three requests stored")
        (row,) = query(tmp_path, "SELECT model, status_code, outcome, error FROM requests WHERE status_code = 503")
        assert row["model"] == SMALL and row["outcome"] == "http_error"
        assert "maximum pending requests exceeded" in row["error"]

        def counted() -> str | None:
            with urllib.request.urlopen(base + "/phasewatch/metrics", timeout=10) as r:
                text = r.read().decode()
            line = f'phasewatch_requests_rejected_total{{model="{SMALL}",reason="queue_full"}} 1.0'
            return text if line in text else None

        wait_until(counted, what="the rejection counted in the metrics")
