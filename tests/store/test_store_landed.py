"""A store written by the landed version (schema v3, ``tests/data/landed_store/make.py``) opens, migrates, and
reads back the same requests with the same phases."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from analysis.phases import Phases, split_record
from analysis.records import FinalMetrics, Outcome, RequestRecord
from store import queries, sample_queries
from store.ops import RederivePhases
from store.queries import StoreState
from store.schema import SCHEMA_VERSION, StoreError, db_path
from store.tables import PHASES_VERSION
from store.writer import StoreWriter
from tests.support.paths import DATA
from tests.support.stale_phases import stale_phases_count

LANDED = DATA / "landed_store"
T0 = 1_780_000_000.0


def _expected() -> list[tuple[RequestRecord, Phases]]:
    out = []
    for item in json.loads((LANDED / "expected.json").read_text()):
        r: dict[str, Any] = item["record"]
        metrics = None if r["metrics"] is None else FinalMetrics(**r["metrics"])
        # Recorded before thinking was kept apart (v6): not known, not 0.
        rec = RequestRecord(**{**r, "metrics": metrics, "outcome": Outcome(r["outcome"]), "thinking_chunks": None})
        out.append((rec, Phases(**item["phases"])))
    return out


@pytest.fixture
def landed(tmp_path: Path) -> Path:
    shutil.copyfile(LANDED / "v3.sqlite3", db_path(tmp_path))
    return tmp_path


def test_the_fixture_is_a_landed_v3_store(landed: Path) -> None:
    conn = sqlite3.connect(db_path(landed))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == len(_expected()) == 6
    conn.close()
    assert queries.store_state(landed) is StoreState.OLDER
    with pytest.raises(StoreError, match="start the collector to migrate"), queries.open_reader(landed):
        pass


def test_migrates_and_reads_the_same_requests_with_the_same_phases(landed: Path) -> None:
    expected = _expected()
    w = StoreWriter(db_path(landed))  # the collector's writer migrates on open
    with queries.open_reader(landed) as conn:
        assert conn is not None
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        # Every request as recorded, token times included; the landed split's numbers in the summary rows.
        for rec, _ in expected:
            stored = queries.request_detail(conn, rec.id)
            assert stored is not None and stored.record == rec and stored.phases_version == 0
        summaries = {s.id: s for s in queries.recent_requests(conn, 0)}
        for rec, phases in expected:
            s = summaries[rec.id]
            got = (s.prefill_tok_s, s.decode_tok_s, s.ttft_s, s.queue_s, s.prompt_tokens, s.cached_tokens, list(s.flags))
            assert got == (
                phases.prefill_tok_s,
                phases.decode_tok_s,
                phases.ttft_s,
                phases.queue_s,
                phases.prompt_tokens,
                phases.cached_tokens,
                phases.flags,
            )
        assert stale_phases_count(conn) == 5  # the finished ones; the running one is its writer's

    # What the collector does next, in the background: derive the older rows again.
    while w.write(RederivePhases()):
        pass
    w.close()
    with queries.open_reader(landed) as conn:
        assert conn is not None
        for rec, phases in expected:
            stored = queries.request_detail(conn, rec.id)
            assert stored is not None and stored.record == rec
            if rec.outcome is not Outcome.IN_FLIGHT:  # derived again by this version's split
                assert stored.phases_version == PHASES_VERSION and stored.phases == split_record(rec), rec.id
                same = ("prefill_tok_s", "decode_tok_s", "queue_s", "prompt_tokens", "cached_tokens", "output_tokens")
                if (rec.endpoint or "").startswith("/v1/"):  # v2 of the split times decode from the stream, counts the chunks
                    ph = stored.phases
                    decode = (ph.decode_s, ph.decode_source, ph.output_tokens, ph.output_tokens_source)
                    assert decode == (pytest.approx(0.161), "stream", 8, "counted")
                    assert (ph.load_s, ph.prefill_s, ph.queue_s) == (None, None, None)
                else:
                    assert all(getattr(stored.phases, k) == getattr(phases, k) for k in same), rec.id
        # The rest of what the landed collector wrote.
        gpu = sample_queries.gpu_samples(conn, T0 - 1, T0 + 10)
        assert [s.util_gpu_pct for s in gpu] == [90.0, 89.0, 88.0, 87.0, 86.0] and gpu[0].pstate == 2
        assert sample_queries.host_samples(conn, T0 - 1, T0 + 1)[0].mem_total_bytes == 64 << 30
        (loaded,) = queries.latest_loaded_models(conn)
        assert loaded.name == "llama3.2:latest" and loaded.family == "llama"
        info = queries.model_info(conn, "llama3.2")
        assert info is not None and info.show["model_info"] == {"llama.block_count": 28}
        status = queries.latest_ollama_status(conn)
        assert status is not None and status.up and status.version == "0.33.0"
        heartbeat = queries.latest_heartbeat(conn)
        assert heartbeat is not None and heartbeat.pid == 4321 and heartbeat.gpu_state == "nvml"
        (exp,) = queries.experiment_rows(conn)
        assert exp.id == "exp-1" and exp.params == {"lengths": [128, 512]} and exp.results == {"rows": [1, 2]}
        assert queries.latest_host_bandwidth(conn) is None  # not measured by the landed version
