"""The proxy says when a recorded request begins (the collector wakes its quiet runner reader with it, so the
request's runner is read at once, not at the next idle step): once per generation, as it begins, and never for
what it only relays."""

from __future__ import annotations

import json
import urllib.request

from tests.support.proxy_thread import run_proxy
from tests.support.record_checks import MODEL
from tests.support.sim_process import SimProcess


def test_each_generation_is_told_as_it_begins_and_nothing_else(sim: SimProcess) -> None:
    began: list[int] = []  # records finished when each begin was told
    with run_proxy(sim.base_url, on_begin=lambda: began.append(len(proxy.records))) as proxy:
        with urllib.request.urlopen(proxy.base_url + "/api/tags", timeout=10) as r:
            r.read()
        assert began == [], "a relayed GET is no recorded request"
        for i in range(3):
            body = {"model": MODEL, "prompt": f"hello {i}", "options": {"num_predict": 8}}
            req = urllib.request.Request(proxy.base_url + "/api/generate", data=json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            proxy.wait_records(i + 1)
    assert began == [0, 1, 2], "told once each, before its record was handed over"
