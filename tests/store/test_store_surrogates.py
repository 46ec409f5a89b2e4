"""Text that is not valid Unicode (a lone UTF-16 surrogate: ``\\ud83d`` from a client cutting a string mid-emoji)
is stored repaired (U+FFFD) and the row flagged ``invalid_text``: never dropped. SQLite stores UTF-8, which
cannot hold a lone surrogate; before, the writer refused the whole row ("surrogates not allowed")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from analysis.phases import FLAG_CODES, Flag
from analysis.records import FinalMetrics, Outcome
from store import queries
from store.ops import PutRequest, RederivePhases
from store.rows import valid_text
from store.schema import db_path
from store.writer import BackgroundWriter, StoreWriter
from tests.support.records import make_record

CUT = "\ud83d"  # the first half of 😀, alone


def _cut(id: str) -> PutRequest:
    rec = make_record(id, model=f"llama3.2{CUT}")
    rec.keep_alive = f"5m{CUT}"
    rec.prompt_text = f"why? {CUT}"
    rec.response_text = f"because {CUT}"
    rec.error = f"Ollama reported an error mid-stream: {CUT}"
    assert rec.metrics is not None
    rec.metrics = FinalMetrics(**{**rec.metrics.__dict__, "done_reason": f"stop{CUT}"})
    return PutRequest(rec)


def test_valid_text_replaces_lone_surrogates_and_joins_pairs() -> None:
    assert valid_text("plain") == "plain"
    assert valid_text(f"a{CUT}b") == "a\ufffdb"
    assert valid_text("\udc00é") == "\ufffdé"  # a lone low half too
    assert valid_text("\ud83d\ude00") == "😀"  # a pair kept as two halves (CESU-8 bytes) is the character
    text = "ünïcödé 😀"
    assert valid_text(text) is text  # valid text is returned as it is, not copied


def test_a_record_with_lone_surrogates_is_stored_repaired_and_flagged(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = BackgroundWriter(path, batch_interval_s=0.01)
    w.submit(PutRequest(make_record("before")))
    w.submit(_cut("cut"))
    w.submit(PutRequest(make_record("after")))
    assert w.flush(10)
    assert w.dropped_count == 0 and w.last_error is None
    assert w.close()

    conn = sqlite3.connect(path)
    cols = "model, keep_alive, prompt_text, response_text, error, done_reason"
    rows = {r[0]: r[1:] for r in conn.execute(f"SELECT id, {cols} FROM requests")}
    conn.close()
    assert set(rows) == {"before", "cut", "after"}  # nothing dropped
    assert rows["cut"] == (
        "llama3.2\ufffd",
        "5m\ufffd",
        "why? \ufffd",
        "because \ufffd",
        "Ollama reported an error mid-stream: \ufffd",
        "stop\ufffd",
    )
    reader = queries.open_readonly(path)
    stored = {s.record.id: s for s in queries.stored_requests(reader, 0)}
    reader.close()
    assert stored["cut"].record.outcome == Outcome.OK
    assert Flag.INVALID_TEXT in stored["cut"].phases.flags
    text = stored["cut"].phases.flag_text[Flag.INVALID_TEXT]
    assert all(name in text for name in ("model", "keep_alive", "prompt_text", "response_text", "error", "done_reason"))
    assert Flag.INVALID_TEXT not in stored["before"].phases.flags
    assert Flag.INVALID_TEXT in FLAG_CODES


def test_the_invalid_text_flag_survives_rederiving_the_phases(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    w.write(_cut("cut"))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE requests SET phases_version = 0")
    conn.commit()
    conn.close()
    assert w.write(RederivePhases()) == 1
    w.close()
    reader = queries.open_readonly(path)
    (stored,) = queries.stored_requests(reader, 0)
    reader.close()
    assert Flag.INVALID_TEXT in stored.phases.flags and "model" in stored.phases.flag_text[Flag.INVALID_TEXT]
