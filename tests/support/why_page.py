"""The Why page over a fixture store written with the collector's own StoreWriter, read back in AppTest.

Requests of several prompt lengths and contexts (``PLAIN``, an interfering pair), the model's /api/show answer
(the simulator's catalog), /api/ps snapshots and NVML samples of an RTX 4090; helpers that read the page's
charts and text as a user sees them."""

from __future__ import annotations

import base64
import json
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from streamlit.testing.v1 import AppTest

from analysis.records import (
    EMBED_ENDPOINTS,
    FinalMetrics,
    GpuSample,
    HostBandwidth,
    LoadedModel,
    Outcome,
    RequestKind,
    RequestRecord,
)
from bench.pages_fixture import Shape, gpu_sample, make_request, status_rows
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples, PutHostBandwidth, PutLoadedModels, PutModelInfo, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60
MODEL = "llama3.2:latest"
BIG = "llama3.1:70b"
GIB = 1024**3
HOST_BW_BYTES_S = 41.5e9  # the stored "measurement" the page must quote


def show_json(name: str) -> dict[str, Any]:
    m = BY_NAME[name]
    return {"details": m.details(), "model_info": m.model_info(), "capabilities": list(m.capabilities), "template": m.template}


@dataclass(frozen=True)
class Req:
    shape: Shape
    offset_s: float  # start, seconds before now
    stall_at: int | None = None
    stall_ms: float = 0.0
    model: str = MODEL

    @property
    def prefill_tok_s(self) -> float:
        return (self.shape.prompt_tokens - (self.shape.cached_tokens or 0)) / (self.shape.prefill_ms / 1000)

    @property
    def decode_tok_s(self) -> float | None:
        n = self.shape.output_tokens
        if n < 2:
            return None
        step_ns = int(self.shape.decode_ms * 1e6 / (n - 1))
        return (n - 1) / (((n - 1) * step_ns + self.stall_ms * 1e6) / 1e9)


def req_shape(prompt: int, prefill_ms: float, output: int, step_ms: float, cached: int = 0) -> Shape:
    return Shape(
        prompt_tokens=prompt, prefill_ms=prefill_ms, output_tokens=output, decode_ms=(output - 1) * step_ms, cached_tokens=cached
    )


# Prompts from 200 to 8,000 tokens, replies 40-200 tokens: rates near what a 4090 gives a 3B Q4 model.
PLAIN = [
    Req(req_shape(200, 10, 40, 4), 280),
    Req(req_shape(600, 25, 60, 4), 250),
    Req(req_shape(1200, 50, 120, 5), 220),
    Req(req_shape(2400, 100, 80, 5), 190),
    Req(req_shape(4800, 250, 200, 6), 160),
    Req(req_shape(8000, 500, 150, 8), 130),
    Req(req_shape(50, 5, 1, 4), 40),  # a one-token reply: a prefill point, no decode rate
    Req(req_shape(3000, 20, 30, 4, cached=2900), 30),  # mostly from the prompt cache
]
# A long prompt arriving while another reply streams: the reply's gap 49 → 50 stretches by 300 ms.
VICTIM = Req(req_shape(300, 10, 100, 5), 100, stall_at=50, stall_ms=300)
AGGRESSOR_DELAY_S = 0.27
AGGRESSOR = Req(req_shape(5000, 250, 20, 5), 100 - AGGRESSOR_DELAY_S)
ALL = [*PLAIN, VICTIM, AGGRESSOR]


def write_requests(w_: StoreWriter, now: float, reqs: list[Req]) -> list[RequestRecord]:
    t0 = now - 600
    recs = [
        make_request(now - r.offset_s, t0, model=r.model, shape=r.shape, stall_at=r.stall_at, stall_ms=r.stall_ms) for r in reqs
    ]
    w_.apply([PutRequest(r) for r in recs])
    return recs


def gpu_with_energy(ts: float, util: float, energy_j: float) -> GpuSample:
    return replace(gpu_sample(ts, util), mem_bus_width_bits=384, energy_j=energy_j, mem_clock_mhz=10251)


def build_store(
    data_dir: Path,
    now: float,
    *,
    reqs: list[Req] = ALL,
    show: bool = True,
    gpu: bool = True,
    loaded: list[LoadedModel] | None = None,
) -> list[RequestRecord]:
    w_ = StoreWriter(db_path(data_dir))
    try:
        # The collector's measurement of this machine's memory bandwidth, as it stores it.
        cpus, mem = os.cpu_count() or 1, int(psutil.virtual_memory().total)
        w_.write(PutHostBandwidth(HostBandwidth(HOST_BW_BYTES_S, now - 3600, 2**28, 2, 3, cpus, mem)))
        recs = write_requests(w_, now, reqs)
        busy = [(r.started_at_unix_s, r.wall_s(r.closed_ns or r.received_ns)) for r in recs]
        if gpu:
            energy = 1_000_000.0
            for ts_i in range(int(now - 600), int(now) + 1):
                util = 95.0 if any(a - 1 <= ts_i <= b + 1 for a, b in busy) else 2.0
                power = 60 + 3.5 * util
                energy += power
                w_.write(PutGpuSamples([gpu_with_energy(float(ts_i), util, energy)]))
        if show:
            for name in (MODEL, BIG):
                w_.write(PutModelInfo(BY_NAME[name].digest, name, show_json(name)))
        if loaded is None:
            loaded = [
                LoadedModel(
                    now - 1,
                    MODEL,
                    MODEL,
                    BY_NAME[MODEL].digest,
                    int(2.6 * GIB),
                    int(2.6 * GIB),
                    8192,
                    now + 240,
                    "3.2B",
                    "Q4_K_M",
                    "llama",
                )
            ]
        w_.write(PutLoadedModels(now - 1, loaded))
        status_rows(w_, now, data_dir, gpu_state="nvml" if gpu else "none")
    finally:
        w_.close()
    return recs


def open_why() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page("pages/why/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Why"
    return at


def figures(at: AppTest) -> dict[str, dict[str, Any]]:
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        out[str(spec["layout"]["title"]["text"]).split(":")[0]] = spec
    return out


def values(v: Any) -> list[Any]:
    """A trace's x or y as a list: Plotly sends numpy arrays as base64 typed arrays."""
    if isinstance(v, dict) and "bdata" in v:
        return list(np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist())
    return list(v or [])


def trace(fig: dict[str, Any], prefix: str) -> dict[str, Any]:
    t = dict(next(t for t in fig["data"] if str(t.get("name", "")).startswith(prefix)))
    return {**t, "x": values(t.get("x")), "y": values(t.get("y"))}


def readings(fig: dict[str, Any]) -> list[tuple[float, float]]:
    """Every measured point of a chart, counted, too short or impossible: (x, the rate in its hover)."""
    out = []
    for t in fig["data"]:
        if t.get("mode") == "markers":
            xs, extra = values(t.get("x")), t.get("customdata") or []
            out += [(x, float(c[1])) for x, c in zip(xs, extra, strict=True)]
    return sorted(out)


def unescape(md: str) -> str:
    """Our Markdown escapes every punctuation mark; read it back as the user sees it."""
    return md.replace("\\", "")


def page_text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [t.value for t in at.text]
    parts += [e.value for e in (*at.info, *at.warning, *at.success)]
    return unescape("\n".join(str(p) for p in parts))


def diagnoses(at: AppTest) -> dict[str, tuple[str, str]]:
    """What each diagnosis means → ("N of M" requests, the newest case's sentence)."""
    out = {}
    for m in at.markdown:
        head, _, sentence = unescape(m.value).partition("  \n")
        if head.startswith(":material/") and " · " in head:
            counts, what = head.split(" · ", 1)
            out[what] = (counts.split("**")[1], sentence)
    return out


def medians(reqs: list[Req]) -> tuple[float, float]:
    """Medians of the readings that count: timed over 32 tokens or more (none of the fixtures' is impossible)."""
    long_prompts = [r.prefill_tok_s for r in reqs if r.shape.prompt_tokens - (r.shape.cached_tokens or 0) >= 32]
    long_replies = [r.decode_tok_s for r in reqs if r.decode_tok_s and r.shape.output_tokens - 1 >= 32]
    return statistics.median(long_prompts), statistics.median([d for d in long_replies if d])


MS = 1_000_000
# (prompt tokens, prefill ms): about 10,000 tok/s, well under a 4090's prefill ceiling for llama3.2 3B.
EMBEDS = [(256, 26.0), (512, 50.0), (1024, 101.0), (2048, 205.0), (4096, 420.0)]
IMPOSSIBLE = (3000, 0.5)  # 6,000,000 tok/s: above any ceiling


def embed_record(i: int, now: float, prompt: int, prefill_ms: float) -> RequestRecord:
    t0 = 5_000 * MS * (i + 1)
    load_ns = 2 * MS
    total_ns = load_ns + round(prefill_ms * MS)
    return RequestRecord(
        id=f"embed{i}",
        started_at_unix_s=now - 50 + i,
        client_addr="127.0.0.1:1",
        endpoint=sorted(EMBED_ENDPOINTS)[0],
        model=MODEL,
        stream=False,
        kind=RequestKind.EMBED,
        batch_size=8,
        received_ns=t0,
        forwarded_ns=t0 + MS,
        first_byte_ns=t0 + MS + total_ns,
        final_chunk_ns=t0 + MS + total_ns,
        closed_ns=t0 + MS + total_ns,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(total_duration_ns=total_ns, load_duration_ns=load_ns, prompt_eval_count=prompt),
    )
