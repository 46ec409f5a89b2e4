"""/metrics' wait split through the whole collector: each finished request's split is taken on the store writer's
thread (off the loop that relays every stream) and counted on the loop, once per request, the same split the
store's rows give."""

from __future__ import annotations

import concurrent.futures
import json
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.wait_metrics import WaitSplits
from store.schema import db_path
from store.tables import REQUESTS as REQUESTS_TABLE
from tests.support.collector_process import collector, listen_url
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REQUESTS = 4
SAMPLES = "phasewatch_request_interference_seconds"


def _generate(base_url: str, i: int) -> None:
    time.sleep(0.4 * i)  # the first decodes while the next ones' long prompts are read beside it
    words = 50 if i == 0 else 1500
    body = {"model": "llama3.2", "prompt": f"request {i}: " + "sky " * words, "options": {"num_predict": 200 if i == 0 else 20}}
    req = urllib.request.Request(base_url + "/api/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def _interference(base_url: str) -> tuple[float, float]:
    """(count, sum) of the interference histogram over all its label sets."""
    with urllib.request.urlopen(base_url + "/phasewatch/metrics", timeout=10) as r:
        text = r.read().decode()
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == SAMPLES + "_count":
                count += s.value
            elif s.name == SAMPLES + "_sum":
                total += s.value
    return count, total


def test_each_finished_request_is_split_once_off_the_loop(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_sim("--hardware", "rtx-3060", "--num-parallel", "2") as sim, collector(data, "--ollama", sim.base_url):
        base = listen_url(data)
        with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:  # four at once on two slots: they overlap
            list(pool.map(lambda i: _generate(base, i), range(REQUESTS)))
        count, total = wait_until(lambda: (got := _interference(base))[0] >= REQUESTS and got, 30, "every request counted")
        assert count == REQUESTS
        # The same split from the stored rows, in the order they finished, as the collector took them.
        conn = sqlite3.connect(db_path(data))
        try:
            values = conn.execute(f"SELECT {REQUESTS_TABLE.select_list()} FROM requests").fetchall()
        finally:
            conn.close()
        rows = sorted((REQUESTS_TABLE.from_values(v) for v in values), key=lambda r: r.decode_end_unix_s or 0.0)
        splits = WaitSplits()
        again = [s for r in rows if (s := splits.split(r)) is not None]
        assert len(again) == REQUESTS
        assert total > 0  # their prompts weighed on each other: the figure compared is not a trivial zero
        assert total == pytest.approx(sum(s.interference_s for s in again), abs=1e-6)
