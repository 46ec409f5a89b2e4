"""Every metric family is declared once (collectors.metrics.FAMILIES): the collector exposes exactly the declared
families, as declared (type, labels), and docs/metrics.md §7 has one line for each."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysis.phases import split_record
from analysis.records import FinalMetrics, GpuSample, HostSample, LoadedModel, OllamaStatus, Outcome, RequestRecord
from collectors.metrics import FAMILIES, Family, MetricsSnapshot, RequestStats, SlotUse, counter_family, gauge_family, render
from store.rows import request_row
from store.tables import PHASES_VERSION, RequestRow

DOC = Path(__file__).resolve().parents[2] / "docs/metrics.md"
# A line of §7's table: | `exposed name` | type | `label`, `label` (or —) |
DOC_LINE = re.compile(r"^\| `(?P<name>[a-z_:]+)` \| (?P<kind>counter|gauge|histogram) \| (?P<labels>[^|]*) \|$")


def documented(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/metrics.md §7 read back: exposed name → (type, labels)."""
    out = {}
    for line in text.splitlines():
        m = DOC_LINE.match(line.strip())
        if m:
            out[m["name"]] = (m["kind"], tuple(re.findall(r"`([a-z_]+)`", m["labels"])))
    return out


def undocumented(families: dict[str, Family], text: str) -> list[str]:
    """Declared families whose line is missing from the doc, or says another type or other labels."""
    docs = documented(text)
    return sorted(f.exposed_name for f in families.values() if docs.get(f.exposed_name) != (f.kind, f.labels))


def _row() -> RequestRow:
    t0 = 1_000_000_000
    rec = RequestRecord(
        id="x",
        started_at_unix_s=1.0,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model="llama3.2",
        stream=True,
        received_ns=t0,
        forwarded_ns=t0,
        first_byte_ns=t0 + 100_000_000,
        first_token_ns=t0 + 100_000_000,
        token_chunk_ns=[t0 + 100_000_000, t0 + 1_100_000_000],
        final_chunk_ns=t0 + 1_100_000_000,
        closed_ns=t0 + 1_100_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(
            total_duration_ns=1_100_000_000,
            load_duration_ns=1_000_000,
            prompt_eval_count=10,
            prompt_eval_duration_ns=50_000_000,
            eval_count=11,
            eval_duration_ns=1_000_000_000,
            done_reason="stop",
        ),
    )
    return request_row(rec, split_record(rec), 1.0, PHASES_VERSION)


def every_reading_known() -> MetricsSnapshot:
    """A snapshot in which nothing is unknown, so every conditional family is exposed."""
    stats = RequestStats.for_upstream("http://127.0.0.1:11434")
    stats.observe(_row(), token_gaps_s=[0.1])
    labels = ("ts_unix_s", "index", "name", "uuid", "simulated")
    gpu_readings: dict[str, Any] = {name: 1 for name in GpuSample.__dataclass_fields__ if name not in labels}
    return MetricsSnapshot(
        gpus=[GpuSample(ts_unix_s=1, index=0, name="GPU", uuid="GPU-a", **gpu_readings)],
        gpu_source="NVIDIA (NVML)",
        host=HostSample(1, 50, 4 << 30, 16 << 30, ollama_cpu_pct=10, ollama_rss_bytes=1 << 30, disk_read_bytes_s=1e6),
        ollama=OllamaStatus(ts_unix_s=1, up=True, base_url="http://127.0.0.1:11434", version="0.33.3"),
        loaded_models=[LoadedModel(1, "m", "m", "d" * 64, 3 << 30, 2 << 30, 4096, None)],
        stats=stats,
        store_failing=False,
        store_dropped=0,
        store_shed=0,
        store_queued_bytes=0,
        store_reopened=0,
        log_dropped={"unconfirmed": 1},
        loads={"m": 1},
        unloads={"m": 1},
        energy_j_by_phase={"decode": 1.0},
        slots=[SlotUse("m", 0, 10, 4096)],
        proxy_refused={("400", "malformed"): 1},
    )


def test_the_collector_exposes_exactly_the_declared_families_with_their_type_and_labels() -> None:
    exposed = {family.name: family for family in text_string_to_metric_families(render(every_reading_known()))}
    assert sorted(exposed) == sorted(FAMILIES)  # the parser drops a counter's _total, as FAMILIES names it
    for name, family in exposed.items():
        declared = FAMILIES[name]
        assert (family.type, family.documentation) == (declared.kind, declared.help), name
        for sample in family.samples:
            assert sorted(k for k in sample.labels if k != "le") == sorted(declared.labels), (name, sample)


def test_every_declared_family_has_its_line_in_docs_metrics_md() -> None:
    text = DOC.read_text()
    assert undocumented(FAMILIES, text) == []
    # And no line for a family that is not declared (one removed, or renamed).
    assert sorted(set(documented(text)) - {f.exposed_name for f in FAMILIES.values()}) == []


def test_a_family_added_without_its_line_is_caught() -> None:
    added = Family("phasewatch_new_things", "counter", "New things.", ("model",))
    text = DOC.read_text()
    assert undocumented({**FAMILIES, added.name: added}, text) == ["phasewatch_new_things_total"]
    with_line = text + "\n| `phasewatch_new_things_total` | counter | `model` |\n"
    assert undocumented({**FAMILIES, added.name: added}, with_line) == []
    wrong_labels = text + "\n| `phasewatch_new_things_total` | counter | `endpoint` |\n"
    assert undocumented({**FAMILIES, added.name: added}, wrong_labels) == ["phasewatch_new_things_total"]


def test_a_family_can_only_be_built_as_declared() -> None:
    with pytest.raises(KeyError):
        gauge_family("phasewatch_not_declared")
    with pytest.raises(TypeError, match="declared a gauge"):
        counter_family("phasewatch_ollama_up")
    assert counter_family("phasewatch_store_reopened", 3).samples[0].value == 3
