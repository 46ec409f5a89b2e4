"""AppTest over a fixture store written with the collector's own StoreWriter: what a user sees on each page.

The app runs in-process (``streamlit.testing.v1.AppTest``) with ``PHASEWATCH_COLLECTOR=off``
so that it reads the fixture and starts no collector of its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import GpuSample, HostSample
from bench.pages_fixture import XSS_PROMPT, XSS_REPLY, Fixture, build_fixture_store, status_rows
from store.ops import PutGpuSamples, PutHostSample, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60  # generous: the test machine is shared


@pytest.fixture
def fixture_store(data_dir: Path) -> Fixture:
    return build_fixture_store(data_dir, time.time())


def run_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def figures(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def trace_names(fig: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in fig["data"]}


def title_of(fig: dict[str, Any]) -> str:
    return str(fig["layout"]["title"]["text"])


def all_text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [t.value for t in at.text] + [c.value for c in at.code]
    parts += [e.value for e in (*at.info, *at.warning, *at.error, *at.caption)]
    return "\n".join(str(p) for p in parts)


# ---------------------------------------------------------------- Live


def test_live_page_shows_flight_gpu_models_host_and_sources(fixture_store: Fixture) -> None:
    at = run_app()
    assert at.title[0].value == "Live"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Generations in flight"] == "1"
    assert int(metrics["Requests in window"]) >= 5

    # One card for the generation in flight: its model, its phase and its tokens so far.
    cards = [m.value for m in at.markdown if "writing the reply (decode)" in m.value]
    assert len(cards) == 1 and "llama3\\.2" in cards[0]
    assert any(m.value.startswith("50 tokens so far") for m in at.markdown)

    figs = figures(at)
    gpu = next(f for f in figs if "RTX 4090" in title_of(f))
    assert {"GPU busy (% of time)", "VRAM used", "power draw", "SM clock", "decode", "prefill", "in flight"} <= trace_names(gpu)
    assert "GPU busy, no recorded generation" in trace_names(gpu)
    assert gpu["layout"]["xaxis4"]["type"] == "date"
    # GPU time no recorded generation explains is named, with the line that records a client whatever the runner shows.
    assert any("no generation recorded, neither through the proxy nor from Ollama's runner" in w.value for w in at.warning)
    assert "OLLAMA_HOST=127.0.0.1:11435" in [c.value for c in at.code]

    models = next(t.value for t in at.table if "context length" in t.value.columns)
    row = models.set_index("model").loc["llama3.1:70b"]
    assert row["on GPU %"] == 50 and row["context length"] == 4096 and row["in system memory"] == "22.5 GB"
    assert any("where the weights sit" in title_of(f) for f in figs)
    host = next(f for f in figs if "Host" in title_of(f))
    assert {"all processes", "Ollama", "used", "total"} <= trace_names(host)

    side = "\n".join(m.value for m in at.sidebar.markdown)
    assert "reachable" in side and "0\\.33\\.0" in side and "RTX 4090" in side
    assert [c.value for c in at.sidebar.code] == ["OLLAMA_HOST=127.0.0.1:11435"]
    assert str(fixture_store.data_dir) in [t.value for t in at.sidebar.text]
    assert at.sidebar.selectbox(key="pw_window").value == "5 min"
    assert at.sidebar.toggle(key="pw_paused").value is False


@pytest.mark.slow
def test_live_page_draws_each_gpu(data_dir: Path) -> None:
    build_fixture_store(data_dir, time.time(), n_gpus=2)
    at = run_app()
    titles = [title_of(f) for f in figures(at)]
    assert any(t.startswith("GPU 0:") for t in titles) and any(t.startswith("GPU 1:") for t in titles)
    side = "\n".join(m.value for m in at.sidebar.markdown)
    assert "GPU 0" in side and "GPU 1" in side


@pytest.mark.slow
def test_pause_and_window_change_what_live_shows(fixture_store: Fixture) -> None:
    # AppTest (1.67) drops the main script's elements from reruns under st.navigation, so each
    # sidebar state gets a fresh app with the widget's value set before its first run.
    in_5_min = int(next(m.value for m in run_app().metric if m.label == "Requests in window"))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.session_state["pw_window"] = "15 min"
    at.session_state["pw_paused"] = True
    at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key="pw_window").value == "15 min"
    in_15_min = int(next(m.value for m in at.metric if m.label == "Requests in window"))
    assert in_15_min > in_5_min  # the fixture holds ten minutes of requests
    assert any("paused" in c.value for c in at.caption)


def test_no_gpu_is_explained(data_dir: Path) -> None:
    now = time.time()
    w = StoreWriter(db_path(data_dir))
    try:
        status_rows(w, now, data_dir, gpu_state="none")
        w.write(PutHostSample(HostSample(now - 1, 10.0, 1 << 33, 1 << 35)))
    finally:
        w.close()
    at = run_app()
    assert [c.value for c in at.caption].count(
        "No GPU found (NVIDIA, AMD or Apple): no GPU timeline. Phases and rates still come from Ollama's timings."
    ) == 1
    side = "\n".join(m.value for m in at.sidebar.markdown)
    # One short line on every page (issue 42), the reason per GPU source behind an expander.
    assert "**GPU** · no GPU found: CPU-only machine, Intel GPU or container; the GPU timeline stays empty" in side
    assert "libnvidia-ml.so.1" not in side + "\n".join(c.value for c in at.sidebar.caption)
    (details,) = [e for e in at.sidebar.expander if e.label == "Why, per GPU source"]
    assert "libnvidia-ml.so.1 not found" in "\n".join(t.value for t in details.text)
    assert any("No model is loaded" in c.value for c in at.caption)


@pytest.mark.parametrize(
    ("gpu_state", "name", "source", "unified"),
    [
        ("amd-sysfs", "AMD Radeon RX 7900 XTX", "AMD (amdgpu sysfs)", False),
        ("macmon", "Apple M2 Max", "Apple Silicon (macmon)", True),
    ],
)
def test_sidebar_names_the_gpu_source_and_live_says_unified_memory(
    data_dir: Path, gpu_state: str, name: str, source: str, unified: bool
) -> None:
    now = time.time()
    w = StoreWriter(db_path(data_dir))
    try:
        status_rows(w, now, data_dir, gpu_state=gpu_state)
        w.write(
            PutGpuSamples(
                [
                    GpuSample(
                        now - 2 + i, 0, name, f"{gpu_state}-0", util_gpu_pct=50.0 + i, power_w=20.0, ollama_mem_bytes=5 << 30
                    )
                    for i in range(2)
                ]
            )
        )
    finally:
        w.close()
    at = run_app()
    assert f"read through {source}" in [c.value for c in at.sidebar.caption]
    assert any(name in m.value for m in at.sidebar.markdown)
    note = "Unified memory: the VRAM line is what Ollama's models hold of system memory"
    assert any(note in c.value for c in at.caption) is unified


# ---------------------------------------------------------------- empty store, Ollama down, demo


def test_empty_store_says_what_to_do(data_dir: Path) -> None:
    at = run_app()
    assert any("Nothing recorded yet" in i.value for i in at.info)
    assert "OLLAMA_HOST=127.0.0.1:11435" in [c.value for c in at.code]
    assert not at.get("plotly_chart")
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception
    assert at.title[0].value == "Requests"
    assert any("Nothing recorded yet" in i.value for i in at.info)


def test_ollama_down_panel_offers_the_demo(data_dir: Path) -> None:
    w = StoreWriter(db_path(data_dir))
    try:
        status_rows(w, time.time(), data_dir, up=False)
    finally:
        w.close()
    at = run_app()
    assert any("Ollama is not answering" in e.value for e in at.error)
    text = all_text(at)
    assert "ollama serve" in text and "OLLAMA_HOST" in text
    assert "connection refused" in text and "http://127.0.0.1:11434" in text
    assert "not answering" in "\n".join(m.value for m in at.sidebar.markdown)
    at.button(key="pw_start_demo").click().run()
    assert not at.exception
    assert at.session_state["pw_demo"] is True
    assert any("Demo mode" in i.value for i in at.info)
    assert not any("Ollama is not answering" in e.value for e in at.error)
    # The demo reads its own, separate store (empty here): demo data never mixes with real data.
    assert any("Nothing recorded yet" in i.value for i in at.info)
    assert at.session_state["pw_ctx"].data_dir == data_dir / "demo"


@pytest.mark.slow
def test_demo_mode_is_said_on_every_page(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEWATCH_DEMO", "1")
    build_fixture_store(data_dir / "demo", time.time())
    at = run_app()
    assert any("Demo mode" in i.value and "simulator" in i.value for i in at.info)
    assert at.get("plotly_chart")  # the demo's own store is read
    at.switch_page("pages/requests/page.py").run()
    assert any("Demo mode" in i.value for i in at.info)


# ---------------------------------------------------------------- Requests


def open_requests() -> AppTest:
    at = run_app()
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Requests"
    return at


@pytest.mark.slow
def test_requests_history_filters_and_csv(fixture_store: Fixture) -> None:
    at = open_requests()
    table = at.dataframe[0].value
    in_window = [r for r in [*fixture_store.finished, fixture_store.in_flight] if r.started_at_unix_s >= fixture_store.now - 300]
    assert len(table) == len(in_window)
    assert {"time", "model", "endpoint", "outcome", "first token", "decode tok/s", "prefill tok/s"} <= set(table.columns)
    assert "None" not in table.to_string() and all(v.endswith(("ms", " s", "min", "—")) for v in table["first token"])
    assert at.get("download_button")
    at.selectbox(key="req_outcome").set_value("upstream_failed").run()
    table = at.dataframe[0].value
    assert list(table["id"]) == [fixture_store.failed.id]
    at.selectbox(key="req_outcome").set_value("cancelled").run()
    assert any("No requests in this window match" in i.value for i in at.info)


@pytest.mark.slow
def test_request_detail_shows_waterfall_gaps_rates_and_story(fixture_store: Fixture) -> None:
    at = open_requests()
    rec = fixture_store.stalled
    at.selectbox(key="req_pick").set_value(rec.id).run()
    assert not at.exception
    figs = figures(at)
    waterfall = next(f for f in figs if "Where the time went" in title_of(f))
    names = trace_names(waterfall)
    assert {"load", "prefill", "decode", "waiting for first byte", "streaming tokens"} <= names
    # The time before prefill: a queue only where the slots are known to have all been held (analysis.wait_split)
    assert {"queue", "wait (unexplained)"} & names, names
    decode = next(t for t in waterfall["data"] if t["name"] == "decode")
    assert rec.metrics is not None and rec.metrics.eval_duration_ns is not None
    assert decode["x"][0] == pytest.approx(rec.metrics.eval_duration_ns / 1e6, rel=1e-6)  # the store's number, in ms
    ttft_ms = (rec.first_token_ns - rec.received_ns) / 1e6  # type: ignore[operator]
    assert any(f"first token {ttft_ms:,.0f} ms" in a["text"] for a in waterfall["layout"]["annotations"])
    gaps = next(f for f in figs if "Gaps between tokens" in title_of(f))
    stall = next(t for t in gaps["data"] if t["name"] == "stall")
    assert len(stall["y"]) == 1 if isinstance(stall["y"], list) else True
    rates = next(t.value for t in at.table if "why they differ" in t.value.columns)
    decode_row = rates.loc["decode (output)"]

    def tok_s(cell: str) -> float:
        return float(cell.removesuffix(" tok/s").replace(",", ""))

    assert tok_s(decode_row["ours (tok/s)"]) < tok_s(decode_row["Ollama's (tok/s)"])  # (n-1)/d beside n/d
    assert "None" not in rates.to_string() and rates.loc["as the client saw it", "Ollama's (tok/s)"] == "—"
    story = "\n".join(t.value for t in at.text)
    assert "Of " in story and "writing 80 tokens" in story
    labels = {m.label: m.value for m in at.metric}
    assert labels["First token"] == f"{ttft_ms:.0f} ms"


@pytest.mark.slow
def test_model_text_is_shown_literally_never_as_markup(fixture_store: Fixture) -> None:
    at = open_requests()
    at.selectbox(key="req_pick").set_value(fixture_store.xss.id).run()
    codes = [c.value for c in at.code]
    assert XSS_REPLY in codes and XSS_PROMPT in codes
    # Nothing from the model reached a Markdown element (which would render links and bold).
    for m in (*at.markdown, *at.caption, *at.info, *at.warning):
        assert "click me" not in m.value and "<script" not in m.value
    at.selectbox(key="req_pick").set_value(fixture_store.failed.id).run()
    assert '{"error":"<b>model runner has stopped</b>"}' in [c.value for c in at.code]


def test_requests_csv_download_escapes_formula_cells(data_dir: Path) -> None:
    """The Download CSV button's bytes (``csv_bytes``): formula text escaped as in ``store export``, numbers kept."""
    import csv
    import io

    from pages.requests.view import csv_bytes
    from tests.support.records import FORMULA_MODELS, make_record

    now = time.time()
    w = StoreWriter(db_path(data_dir))
    w.apply([PutRequest(make_record(f"f{i}", now - 60 + i, model=m)) for i, m in enumerate([*FORMULA_MODELS, "llama3.2"])])
    w.close()
    text = csv_bytes(db_path(data_dir), now - 300, now, None, None, None).decode()
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert sorted(r["model"] for r in rows) == sorted([*("'" + m for m in FORMULA_MODELS), "llama3.2"])
    for r in rows:
        assert float(r["ttft_s"]) == pytest.approx(0.2)  # numbers stay numbers
        assert not r["started_at"].startswith("'") and not r["id"].startswith("'")


@pytest.mark.slow
def test_a_live_card_link_opens_its_request(fixture_store: Fixture) -> None:
    # The finished card's "Details in Requests" link carries ?request=<id>; Requests picks that request.
    at = run_app()
    at.query_params["request"] = fixture_store.stalled.id
    at.switch_page("pages/requests/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="req_pick").value == fixture_store.stalled.id
