"""Live's cards for a cloud model's running request (issue 41: run on ollama.com, no local phase, no ceiling, said so;
pure: no store). Before its first token it waits for ollama.com, not for a load (Ollama loads nothing for it) and not
for a slot; it never makes a local model's load wait behind it; writing, it has no ceiling of this machine."""

from __future__ import annotations

from pages.live.cards import CLOUD_WAITS_FOR, in_flight_cards
from pages.live.queue import queue_cards
from pages.live.ui import wait_caption
from tests.support.live_cards import LOADED, T0, record

CLOUD = "gpt-oss:120b-cloud"
UNLOADED = "qwen3:8b"  # a local model not in memory: its request waits for its load


def test_a_cloud_request_waits_for_ollama_com_not_a_load() -> None:
    recs = [record("cloud", CLOUD), record("local", UNLOADED, started=T0 + 1)]
    cards = {c.request_id: c for c in in_flight_cards(recs, {}, LOADED, T0 + 3)}
    cloud, local = cards["cloud"], cards["local"]
    assert cloud.phase == "waiting" and cloud.waits_for == CLOUD_WAITS_FOR and cloud.state_s == 3.0
    caption = wait_caption(cloud, None)
    assert caption is not None and caption.startswith("Waiting for ollama") and caption.endswith("3.00 s so far.")
    # The local model's load is the one Ollama does: not "waiting for gpt-oss:120b-cloud to load first".
    assert local.phase == "loading" and (local.waits_for or "").find(CLOUD) < 0


def test_cloud_requests_are_not_queued_for_a_slot_here() -> None:
    recs = [record("c1", CLOUD, tokens=(0.5, 0.6)), record("c2", CLOUD, started=T0 + 1)]
    cards, queues = queue_cards(in_flight_cards(recs, {}, LOADED, T0 + 3), {})
    waiting = next(c for c in cards if c.request_id == "c2")
    assert waiting.phase == "waiting" and waiting.queue_position is None and waiting.waits_for == CLOUD_WAITS_FOR
    assert queues == []


def test_a_cloud_request_writing_has_no_local_ceiling() -> None:
    recs = [record("cloud", CLOUD, tokens=(0.4, 0.5, 0.6)), record("local", "llama3.2:latest", tokens=(0.4, 0.5, 0.6))]
    cards = {c.request_id: c for c in in_flight_cards(recs, {}, LOADED, T0 + 1, lambda m, ctx: 100.0)}
    assert cards["cloud"].phase == cards["local"].phase == "decoding"
    assert cards["cloud"].decode_ceiling_tok_s is None and cards["local"].decode_ceiling_tok_s == 100.0
