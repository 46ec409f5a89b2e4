"""Live on the H200 run (tests/support/real_gpu.py): a reply being written is set against the decode ceiling of
the model's basis, the Why page's (where the runner put the model, not /api/ps's "all in system memory"), and a
finished card names what the runner did before reading its prompt."""

from __future__ import annotations

from pathlib import Path

from pages.live.cards import finished_cards
from pages.live.view import build_cards, build_live, load_cards
from pages.why.view import build_why
from store import queries
from store.ops import PutRequest
from store.writer import StoreWriter
from tests.support.real_gpu import MODEL, real_gpu_store
from tests.support.records import make_record

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"  # 272 tokens, after a 16,414-token prompt: a 1,362 MiB save first


def _ended_at(path: Path) -> dict[str, float]:
    reader = queries.open_readonly(path)
    try:
        return {r.id: r.ended_at_unix_s or r.started_at_unix_s for r in queries.recent_requests(reader, 0.0, limit=100)}
    finally:
        reader.close()


def test_a_decoding_card_is_set_against_the_runners_placement(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True)
    now = max(_ended_at(path).values()) + 5
    writing = make_record("writing", now - 2, final=False, n_tokens=40, model=MODEL)
    w = StoreWriter(path)
    try:
        w.write(PutRequest(writing))
    finally:
        w.close()
    cards = build_cards(path, now, 300.0)
    assert cards is not None
    [card] = [c for c in cards.cards if c.request_id == "writing"]
    why = build_why(path, MODEL, now_unix_s=now, window_s=1e9)
    assert why is not None and why.story is not None
    # The Why chart's decode ceiling at this context: 49/49 layers on the H200 (hundreds of tok/s), not the ~11 tok/s
    # that /api/ps's "100% in system memory" gave.
    assert card.decode_ceiling_tok_s is not None and card.decode_ceiling_tok_s > 300, card.decode_ceiling_tok_s
    context = card.ctx_used_tokens if card.ctx_used_tokens is not None else card.tokens_so_far
    assert card.decode_ceiling_tok_s == why.story.model.at(0, context).decode_ceiling_tok_s


def test_a_finished_card_names_the_runners_waits(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True, with_waits=True)
    now = _ended_at(path)[AFTER_16K] + 1
    snap = load_cards(path, now, 300.0, recent_s=30.0)
    assert snap is not None
    cards = {c.request_id: c for c in finished_cards(snap.recent, now, keep_s=30.0, waits=snap.waits)}
    waits = cards[AFTER_16K].runner_waits
    assert waits is not None and waits.startswith("prompt-cache save 1,362 MiB"), waits


def test_the_loaded_models_table_takes_the_runners_placement_and_shows_api_ps_beside_it(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True)
    now = max(_ended_at(path).values()) + 5
    live = build_live(path, now, 300.0, flight=False, timeline=False, context=True)
    assert live is not None
    [row] = live.models_table.to_dict("records")
    assert row["on GPU %"] == 100, row  # /api/ps said 0 (size_vram 0)
    assert row["placement from"] == "the runner's load lines (49/49 layers on CUDA0 (NVIDIA H200)); /api/ps says 0%", row
