"""Requests waiting behind busy slots, through the whole collector in front of sim: Live counts as many waiting as
were sent beyond the slots, and each waiting card says its place in line.

sim serves each model with ``--num-parallel 2`` slots, in the order requests came (as Ollama does). After one
request loads the model, five are sent at once, each writing 800 tokens (2-4 s on sim's RTX 4090 at two
at a time): two run, three wait. The cards are built from the store as the Live page builds them.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pages.live.queue import queue_caption
from pages.live.view import build_cards
from store import queries
from store.schema import db_path
from tests.support.clients import stream_generate
from tests.support.collector_process import collector, listen_url
from tests.support.sim_process import start_sim
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

MODEL = "llama3.2:latest"
SENT = 5
SLOTS = 2


def _loaded(data: Path) -> bool:
    with queries.open_reader(db_path(data)) as conn:
        return conn is not None and any(m.name == MODEL for m in queries.latest_loaded_models(conn))


@pytest.mark.slow  # a model load, then five generations two at a time: ~8-12 s on this shared machine
def test_requests_behind_busy_slots_are_counted_waiting_with_their_place_in_line(tmp_path: Path) -> None:
    with start_sim("--num-parallel", str(SLOTS)) as sim, collector(tmp_path, "--ollama", sim.base_url):
        base = listen_url(tmp_path)
        warm: dict[str, Any] = {}
        stream_generate(base, {"model": MODEL, "prompt": "Hi", "stream": True, "options": {"num_predict": 4}}, warm)
        assert "final" in warm
        wait_until(lambda: _loaded(tmp_path), 30, "the collector to see the model loaded")  # else its cards say loading
        body = {"model": MODEL, "prompt": "Tell me a story", "stream": True, "options": {"num_predict": 800}}
        outs: list[dict[str, Any]] = [{} for _ in range(SENT)]
        threads = [threading.Thread(target=stream_generate, args=(base, body, out), daemon=True) for out in outs]
        for t in threads:
            t.start()
        seen: list[tuple[int, int, list[str]]] = []  # (running, waiting, the waiting cards' captions) while all are open
        while any(t.is_alive() for t in threads):
            model = build_cards(db_path(tmp_path), time.time(), 300)
            running = [c for c in model.cards if c.phase != "finished"] if model else []
            if model and len(running) == SENT and not any("final" in o for o in outs):
                (q,) = model.queues
                captions = [queue_caption(c) or "" for c in running if c.phase == "queued"]
                seen.append((q.running, q.waiting, captions))
            time.sleep(0.1)
        for t in threads:
            t.join(30)
        assert all("final" in o for o in outs)
        assert sim.base_url  # sim served them all

    settled = [s for s in seen if (s[0], s[1]) == (SLOTS, SENT - SLOTS)]
    assert len(settled) >= 3, [(r, w) for r, w, _ in seen]
    assert all(r + w == SENT for r, w, _ in seen)  # every open request is counted once
    assert max(w for _r, w, _ in seen) == SENT - SLOTS  # never more waiting than were sent beyond the slots
    assert sorted(settled[-1][2]) == [
        "waiting: 1 ahead, 2 running (how many slots it has is not known)",
        "waiting: 2 ahead, 2 running (how many slots it has is not known)",
        "waiting: next in line, 2 running (how many slots it has is not known)",
    ]


@pytest.mark.slow  # a model load, then three generations one at a time: ~8-12 s on this shared machine
def test_ollamas_own_queue_gauge_is_read_beside_ours(tmp_path: Path) -> None:
    """sim serving /metrics (as Ollama would with OLLAMA_METRICS set): its ollama_requests_queued is read by the
    collector and shown per model beside the count from the proxy; they agree."""
    with start_sim("--num-parallel", "1", "--metrics") as sim, collector(tmp_path, "--ollama", sim.base_url):
        with urllib.request.urlopen(sim.base_url + "/metrics", timeout=10) as r:
            assert r.status == 200 and r.headers.get_content_type() == "text/plain"
        base = listen_url(tmp_path)
        warm: dict[str, Any] = {}
        stream_generate(base, {"model": MODEL, "prompt": "Hi", "stream": True, "options": {"num_predict": 4}}, warm)
        wait_until(lambda: _loaded(tmp_path), 30, "the collector to see the model loaded")
        body = {"model": MODEL, "prompt": "Tell me a story", "stream": True, "options": {"num_predict": 600}}
        outs: list[dict[str, Any]] = [{} for _ in range(3)]
        threads = [threading.Thread(target=stream_generate, args=(base, body, out), daemon=True) for out in outs]
        for t in threads:
            t.start()
        seen: list[tuple[int, int | None]] = []  # (waiting by our count, Ollama's gauge) while all three are open
        while any(t.is_alive() for t in threads):
            model = build_cards(db_path(tmp_path), time.time(), 300)
            if model and model.queues and not any("final" in o for o in outs):
                seen.append((model.queues[0].waiting, model.queues[0].ollama_queued))
            time.sleep(0.1)
        for t in threads:
            t.join(30)
    assert sum(1 for s in seen if s == (2, 2)) >= 3, seen  # one runs, two wait: both counts say so
