"""Chart builders and the pure helpers under the pages: figures carry what a user should see."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from analysis.records import GpuSample, HostSample, LoadedModel, RequestRecord
from pages.live import timeline
from pages.shared import charts, derive
from pages.shared.charts import Span
from pages.shared.derive import Band, Interval
from store import queries, sample_queries
from store.ops import PutGpuSamples
from store.schema import db_path
from store.writer import StoreWriter

T0 = 1_800_000_000.0  # a fixed wall clock


def gpu(ts: float, util: float | None, **kw: object) -> GpuSample:
    base: dict[str, object] = dict(
        ts_unix_s=ts,
        index=0,
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-1",
        util_gpu_pct=util,
        util_mem_pct=10.0,
        mem_used_bytes=8 * 1024**3,
        mem_total_bytes=24 * 1024**3,
        power_w=250.0,
        power_limit_w=450.0,
        sm_clock_mhz=2520,
        mem_clock_mhz=10501,
    )
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


def names(fig: go.Figure) -> set[str]:
    return {t.name for t in fig.data}


def test_gpu_timeline_has_titles_units_legend_and_bands() -> None:
    samples = [gpu(T0 + i, 50.0) for i in range(60)]
    bands = timeline.assign_lanes(
        [
            Band("a" * 32, "llama3.2:latest", "prefill", T0 + 10, T0 + 11),
            Band("a" * 32, "llama3.2:latest", "decode", T0 + 11, T0 + 20),
            Band("b" * 32, "llama3.2:latest", "decode", T0 + 15, T0 + 25),
        ]
    )
    fig = charts.gpu_timeline_figure(samples, bands, T0, T0 + 60)
    assert "RTX 4090" in fig.layout.title.text
    assert {"GPU busy (% of time)", "VRAM used", "power draw", "SM clock", "prefill", "decode"} <= names(fig)
    assert fig.layout.yaxis.title.text == "%"
    assert fig.layout.yaxis2.title.text == "GB"
    assert fig.layout.yaxis3.title.text == "W"
    assert fig.layout.yaxis4.title.text == "MHz"  # the SM clock on the power panel's right-hand axis
    assert fig.layout.yaxis5.title.text == "lane"
    # Each panel has its own legend, and every line's hover says what it measures.
    assert {t.legend or "legend" for t in fig.data} == {"legend", "legend2", "legend3", "legend4"}
    busy = next(t for t in fig.data if t.name == "GPU busy (% of time)")
    mem_busy = next(t for t in fig.data if t.name == "memory busy (% of time)")
    assert mem_busy.line.dash == "dot"  # told apart from GPU busy even where they coincide
    area = next(t for t in fig.data if t.name == "GPU busy (% of time), area")  # the shading under it
    assert area.fill == "toself" and area.legendgroup == busy.legendgroup and not area.showlegend
    assert "kernel" in busy.hovertemplate
    assert "streaming multiprocessors" in next(t for t in fig.data if t.name == "SM clock").hovertemplate
    assert fig.layout.uirevision == "gpu-0"
    decode = next(t for t in fig.data if t.name == "decode")
    # The two overlapping requests sit in two lanes; durations are in ms on the date axis.
    assert sorted(decode.y) == ["lane 1", "lane 2"]
    assert sorted(decode.x) == pytest.approx([9000.0, 10000.0])
    assert "lane: one row of this chart" in decode.hovertemplate and "lane 1" in decode.hovertext[0]
    json.loads(fig.to_json())  # serialisable as the browser receives it


def test_gpu_timeline_leaves_out_unsupported_sensors_and_marks_bypass() -> None:
    samples = [gpu(T0 + i, 90.0, power_w=None, power_limit_w=None) for i in range(30)]
    fig = charts.gpu_timeline_figure(samples, [], T0, T0 + 30, unexplained=[Interval(T0 + 5, T0 + 20)])
    assert "power draw" not in names(fig)
    busy = next(t for t in fig.data if t.name == "GPU busy, no recorded generation")
    assert busy.fill == "toself" and list(busy.y[:4]) == [0, 100, 100, 0]  # one shaded stretch over utilization


def test_short_phases_get_a_minimum_width() -> None:
    bands = [Band("a" * 32, "m", "prefill", T0 + 10, T0 + 10.05), Band("a" * 32, "m", "decode", T0 + 10.05, T0 + 10.2)]
    fig = charts.gpu_timeline_figure([], bands, T0, T0 + 300)
    prefill = next(t for t in fig.data if t.name == "prefill")
    assert prefill.x[0] == pytest.approx(300_000 / 400)  # 50 ms drawn as a 400th of the 5-minute window
    assert "prefill: 50 ms" in prefill.hovertext[0]  # the hover keeps the true duration


def test_downsample_bounds_points_and_keeps_means() -> None:
    x = np.arange(86_400)
    y = {"u": np.where(np.arange(86_400) % 2 == 0, 0.0, 100.0), "nan": np.full(86_400, np.nan)}
    xs, ys = charts.downsample(x, y, max_points=864)
    assert len(xs) <= 864 and len(ys["u"]) == len(xs)
    assert np.allclose(ys["u"], 50.0)
    assert np.all(np.isnan(ys["nan"]))


def test_waterfall_puts_phases_on_one_axis_with_ttft() -> None:
    fig = charts.phase_waterfall_figure(
        [Span("load", 1, 301), Span("queue", 301, 320), Span("prefill", 320, 420), Span("decode", 420, 2420)],
        [Span("waiting for first byte", 0, 421), Span("streaming tokens", 421, 2421)],
        ttft_ms=421.0,
        title="Where the time went",
    )
    assert {"load", "queue", "prefill", "decode", "waiting for first byte", "streaming tokens"} <= names(fig)
    decode = next(t for t in fig.data if t.name == "decode")
    assert decode.base[0] == 420 and decode.x[0] == 2000
    assert decode.y[0] == "Ollama reported"
    assert "first token 421 ms" in fig.layout.annotations[0].text
    assert "ms since" in fig.layout.xaxis.title.text


def test_token_gaps_marks_stalls() -> None:
    chunks = [1_000_000_000 + i * 20_000_000 for i in range(50)]
    chunks += [chunks[-1] + 900_000_000 + i * 20_000_000 for i in range(1, 20)]  # one 900 ms stall
    fig = charts.token_gaps_figure(chunks, received_ns=900_000_000)
    stall = next(t for t in fig.data if t.name == "stall")
    assert len(stall.y) == 1 and stall.y[0] == pytest.approx(920.0)
    assert "gap" in fig.layout.yaxis.title.text and "ms" in fig.layout.yaxis.title.text


def test_loaded_models_and_host_figures() -> None:
    m = LoadedModel(T0, "big:70b", "big:70b", "d" * 64, 40 * 1024**3, 22 * 1024**3, 4096, T0 + 300)
    fig = charts.loaded_models_figure([m])
    assert list(fig.data[0].x) == pytest.approx([22 * 1024**3 / 1e9]) and list(fig.data[1].x) == pytest.approx(
        [18 * 1024**3 / 1e9]
    )
    assert fig.layout.xaxis.title.text == "GB"
    host = charts.host_figure([HostSample(T0 + i, 30.0, 8 * 1024**3, 32 * 1024**3) for i in range(10)], T0, T0 + 10)
    assert {"all processes", "used", "total"} <= names(host)
    assert "Ollama" not in names(host)  # no per-process numbers: no empty trace
    # Whole-machine % and Ollama's % of one core never share an axis.
    both = charts.host_figure(
        [HostSample(T0 + i, 30.0, 8 * 1024**3, 32 * 1024**3, 250.0, 1024**3) for i in range(10)], T0, T0 + 10
    )
    machine = next(t for t in both.data if t.name == "all processes")
    ollama = next(t for t in both.data if t.name == "Ollama")
    assert machine.yaxis != ollama.yaxis
    assert both.layout.yaxis.title.text == "% of all cores" and both.layout.yaxis2.title.text == "% of one core"


def test_chart_text_from_users_is_escaped() -> None:
    bands = [Band("c" * 32, "<img src=x onerror=alert(1)>", "decode", T0, T0 + 1)]
    fig = charts.gpu_timeline_figure([], bands, T0, T0 + 10)
    decode = next(t for t in fig.data if t.name == "decode")
    assert "<img" not in json.dumps(decode.customdata.tolist() if hasattr(decode.customdata, "tolist") else decode.customdata)


def test_unexplained_activity_ignores_proxied_requests() -> None:
    samples = [gpu(T0 + i, 95.0 if 10 <= i < 20 or 40 <= i < 50 else 0.0) for i in range(60)]
    found = timeline.unexplained_gpu_activity(samples, [Interval(T0 + 9, T0 + 21)])
    assert found == [Interval(T0 + 40, T0 + 49)]


def test_live_helpers() -> None:
    rec = RequestRecord(
        id="r", started_at_unix_s=T0, client_addr="127.0.0.1", endpoint="/api/chat", model="m:latest", stream=True
    )
    assert timeline.live_phase(rec, []) == "loading model"
    assert timeline.live_phase(rec, ["m:latest"]) == "waiting or prefill (no tokens yet)"
    assert timeline.live_phase(rec, ["library/M"]) == "waiting or prefill (no tokens yet)"  # Ollama's name rules
    rec.token_chunk_ns = [i * 10_000_000 for i in range(101)]  # 100 tokens/s
    rec.first_token_ns = 0
    view = timeline.in_flight_view(rec, T0 + 2.5, ["m:latest"])
    assert view.phase == "decoding" and view.tokens_so_far == 101 and view.elapsed_s == pytest.approx(2.5)
    assert view.live_tok_s == pytest.approx(100.0)
    # Seconds later with no new token: the live rate falls to 0 and the phase says why.
    stalled = timeline.in_flight_view(rec, T0 + 6.0, ["m:latest"])
    assert stalled.phase == "decoding, no token for 5 s" and stalled.live_tok_s == 0.0
    # A long stream: the rate over the last 3 s only (50 tokens/s there).
    assert timeline.live_tok_s([i * 20_000_000 for i in range(500)], now_ns=10_000_000_000) == pytest.approx(50.0, abs=0.4)
    assert derive.stall_threshold_ms([10, 10, 10, 10]) == pytest.approx(60.0)


def test_md_escape_breaks_autolinks_and_keeps_the_text() -> None:
    from pages.shared.fmt import WORD_JOINER, md_escape

    text = "m http://a.example/x HTTPS://b.example www.c.example WWW.d.example e@f.example **bold** [l](u)"
    escaped = md_escape(text)
    assert escaped.replace(WORD_JOINER, "").replace("\\", "") == text  # what the reader sees, literally
    for start in ("http://", "HTTPS://", "www.", "WWW.", "e@f"):
        assert start not in escaped.replace("\\", ""), start  # no autolink can start
    assert md_escape("llama3.2:latest") == "llama3\\.2\\:latest"  # ordinary names unchanged but for escapes


def _breaks(trace: go.Scatter) -> list[int]:
    return [i for i, v in enumerate(trace.y) if v is None or (isinstance(v, float) and np.isnan(v))]


def test_a_gap_in_the_samples_breaks_the_lines_instead_of_drawing_a_slope() -> None:
    # The collector stopped for two minutes: Plotly drew a ramp from the last value before to the first after.
    before = [HostSample(T0 + i, 5.0, 8 * 1024**3, 32 * 1024**3, 10.0, 1024**3) for i in range(60)]
    after = [HostSample(T0 + 180 + i, 95.0, 9 * 1024**3, 32 * 1024**3, 10.0, 1024**3) for i in range(60)]
    hiccup = [HostSample(T0 + 243 + i, 50.0, 9 * 1024**3, 32 * 1024**3, 10.0, 1024**3) for i in range(10)]  # 3 s late
    fig = charts.host_figure(before + after + hiccup, T0, T0 + 260)
    for name in ("all processes", "used", "Ollama", "total"):
        trace = next(t for t in fig.data if t.name == name)
        assert _breaks(trace) == [60], name  # one break, in the two minutes; none at the 3 s hiccup
        gap_x = np.datetime64(trace.x[60], "ms").astype("int64") / 1000 - charts._local_offset_s()
        assert T0 + 59 < gap_x < T0 + 180  # inside the gap, never on a sample
    assert len(next(t for t in fig.data if t.name == "all processes").y) == 131  # every sample kept, one NaN added


def test_gaps_break_gpu_lines_read_through_the_stores_buckets(tmp_path: Path) -> None:
    # 20 min of 1 Hz samples, 20 min of nothing, 20 min again: a one-hour window is read as time buckets.
    w = StoreWriter(db_path(tmp_path))
    try:
        w.apply([PutGpuSamples((gpu(T0 + t, 40.0 + (t % 7)),)) for t in [*range(0, 1200), *range(2400, 3600)]])
    finally:
        w.close()
    with queries.open_reader(db_path(tmp_path)) as conn:
        assert conn is not None
        samples = sample_queries.gpu_samples(conn, T0, T0 + 3600)
    assert len(samples) < 2400  # bucketed, as a page reads an hour
    fig = charts.gpu_timeline_figure(samples, [], T0, T0 + 3600)
    busy = next(t for t in fig.data if t.name == "GPU busy (% of time)")
    (at,) = _breaks(busy)
    x = np.array(busy.x, dtype="datetime64[ms]").astype("int64") / 1000 - charts._local_offset_s()
    assert x[at - 1] < T0 + 1200 and x[at + 1] >= T0 + 2400  # the break spans exactly the missing 20 minutes
    # Its shading too: one closed shape per stretch with samples, none across the 20 minutes (Plotly's own
    # fill="tozeroy" spans the NaN that breaks the line).
    area = next(t for t in fig.data if t.name == "VRAM used, area")
    shapes: list[list[float]] = [[]]
    for v in area.x:
        if v is None:
            shapes.append([])
        else:
            shapes[-1].append(float(np.datetime64(v, "ms").astype("int64")) / 1000 - charts._local_offset_s())
    spans = [(min(xs), max(xs)) for xs in shapes if xs]
    assert len(spans) == 2 and spans[0][1] < T0 + 1200 and spans[1][0] >= T0 + 2400


def test_break_gaps_leaves_short_and_regular_series_alone() -> None:
    x = charts.local_times([T0, T0 + 100])
    assert charts.break_gaps(x, {"a": np.array([1.0, 2.0])})[0] is x  # two points: no usual step to judge by
    x = charts.local_times([T0 + 60 * i for i in range(10)])  # per-minute buckets of a long window
    assert len(charts.break_gaps(x, {"a": np.ones(10)})[0]) == 10
