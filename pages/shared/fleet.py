"""Several hosts through Prometheus: PromQL over its HTTP API for the Hosts page and the Live page's alert banner.

Set ``PHASEWATCH_PROMETHEUS`` to the URL of a Prometheus that scrapes the collectors (``deploy/prometheus.yml``);
without it there is no Hosts page and no banner. A host is one scrape target of job ``phasewatch``: its
``instance`` label (the collector's address), its ``host`` label when the config gives one, and its
``dashboard_url`` label: where that machine's own Phasewatch answers (linked when it is reachable).
"""

from __future__ import annotations

import json
import math
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PROMETHEUS_ENV = "PHASEWATCH_PROMETHEUS"
JOB = "phasewatch"
TIMEOUT_S = 5.0
WINDOW = "1h"  # percentiles and rates over the last hour: a home host is idle most of the time
SPARK_RANGE_S = 900.0  # sparklines: the last 15 minutes
SPARK_STEP_S = 15.0

_J = f'job="{JOB}"'
EXPR = {
    "up": f"up{{{_J}}}",
    "models": f'phasewatch_model_loaded_bytes{{{_J},memory="vram"}}',
    "in_flight": f"sum by (instance) (phasewatch_requests_running{{{_J}}})",
    "ttft_p50_s": f"histogram_quantile(0.5, sum by (instance, le) "
    f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{{{_J}}}[{WINDOW}])))",
    "ttft_p95_s": f"histogram_quantile(0.95, sum by (instance, le) "
    f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{{{_J}}}[{WINDOW}])))",
    "decode_tok_s": f"sum by (instance) (increase(phasewatch_decode_tokens_total{{{_J}}}[{WINDOW}])) / "
    f'sum by (instance) (increase(phasewatch_phase_seconds_total{{{_J},phase="decode"}}[{WINDOW}]))',
    "gpu_busy_ratio": f"avg by (instance) (phasewatch_gpu_utilization_ratio{{{_J}}})",
    "vram_used_bytes": f"sum by (instance) (phasewatch_gpu_memory_used_bytes{{{_J}}})",
    "vram_total_bytes": f"sum by (instance) (phasewatch_gpu_memory_total_bytes{{{_J}}})",
    "power_w": f"sum by (instance) (phasewatch_gpu_power_watts{{{_J}}})",
    "alerts": 'ALERTS{alertstate="firing"}',  # alerts aggregated by instance carry no job label
}
SPARKS = {
    "output tok/s": f"sum by (instance) (rate(phasewatch_generation_tokens_total{{{_J}}}[1m]))",
    "GPU W": f"sum by (instance) (phasewatch_gpu_power_watts{{{_J}}})",
}


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or refused the query (the text says which)."""


def prometheus_url(env: dict[str, str] | None = None) -> str | None:
    value = (os.environ if env is None else env).get(PROMETHEUS_ENV, "").strip().rstrip("/")
    return value or None


def _api(base_url: str, path: str, params: dict[str, str]) -> dict[str, Any]:
    url = f"{base_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            body = json.load(r)
    except urllib.error.HTTPError as exc:
        try:
            body = json.load(exc)
        except ValueError:
            raise PrometheusError(f"Prometheus at {base_url} answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"cannot reach Prometheus at {base_url}: {exc}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else body
        raise PrometheusError(f"Prometheus refused the query: {error}")
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError("Prometheus answered without data")
    return data


def _number(text: object) -> float | None:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) else None  # NaN (no observations) is unknown, not zero


def query(base_url: str, expr: str) -> list[tuple[dict[str, str], float | None]]:
    """An instant query: (labels, value) per series; a NaN or infinite value is None."""
    result = _api(base_url, "query", {"query": expr}).get("result", [])
    return [(dict(r["metric"]), _number(r["value"][1])) for r in result if isinstance(r, dict)]


def query_range(base_url: str, expr: str, start_s: float, end_s: float, step_s: float) -> dict[str, list[tuple[float, float]]]:
    """A range query, by instance: [(unix s, value)], unknown points left out."""
    data = _api(base_url, "query_range", {"query": expr, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"})
    out: dict[str, list[tuple[float, float]]] = {}
    for r in data.get("result", []):
        points = [(float(t), v) for t, text in r["values"] if (v := _number(text)) is not None]
        out[r["metric"].get("instance", "")] = points
    return out


@dataclass
class HostRow:
    instance: str  # the collector's address, as Prometheus scrapes it
    host: str  # the target's `host` label, else the instance
    up: bool
    dashboard_url: str | None = None
    dashboard_reachable: bool = False
    models: list[str] = field(default_factory=list)
    in_flight: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    decode_tok_s: float | None = None
    gpu_busy_ratio: float | None = None
    vram_used_bytes: float | None = None
    vram_total_bytes: float | None = None
    power_w: float | None = None
    alerts: list[str] = field(default_factory=list)
    sparks: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    spark_start_s: float | None = None  # the sparklines' common start (their end is now)


def reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a host's own dashboard answers (any HTTP answer below 500)."""
    if not url.startswith(("http://", "https://")):
        return False
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def spark_start_s(base_url: str, now_s: float) -> float:
    """Where the sparklines start: 15 minutes ago, or when the oldest collector was first scraped, if later."""
    start_s = now_s - SPARK_RANGE_S
    series = query_range(base_url, EXPR["up"], start_s, now_s, SPARK_STEP_S)
    firsts = [points[0][0] for points in series.values() if points]
    if firsts and min(firsts) > start_s:
        return max(min(firsts) - SPARK_STEP_S, now_s - SPARK_RANGE_S)  # the first scrape lies within a step before
    return start_s


def host_rows(base_url: str, now_s: float, *, check_links: bool = True) -> list[HostRow]:
    """One row per scrape target of job ``phasewatch``, sorted by host name. Raises PrometheusError."""
    rows: dict[str, HostRow] = {}
    for labels, value in query(base_url, EXPR["up"]):
        inst = labels.get("instance", "")
        rows[inst] = HostRow(inst, labels.get("host") or inst, value == 1, labels.get("dashboard_url") or None)
    for labels, _ in query(base_url, EXPR["models"]):
        row = rows.get(labels.get("instance", ""))
        if row is not None and labels.get("model"):
            row.models.append(labels["model"])
    for key in (
        "in_flight",
        "ttft_p50_s",
        "ttft_p95_s",
        "decode_tok_s",
        "gpu_busy_ratio",
        "vram_used_bytes",
        "vram_total_bytes",
        "power_w",
    ):
        for labels, value in query(base_url, EXPR[key]):
            row = rows.get(labels.get("instance", ""))
            if row is not None:
                setattr(row, key, value)
    for labels, _ in query(base_url, EXPR["alerts"]):
        row = rows.get(labels.get("instance", ""))
        if row is not None and labels.get("alertname") and labels["alertname"] not in row.alerts:
            row.alerts.append(labels["alertname"])
    start_s = spark_start_s(base_url, now_s)
    step_s = max(1.0, min(SPARK_STEP_S, (now_s - start_s) / 60))  # about 60 points even for a young fleet
    for name, expr in SPARKS.items():
        for inst, points in query_range(base_url, expr, start_s, now_s, step_s).items():
            if inst in rows:
                rows[inst].sparks[name] = points
                rows[inst].spark_start_s = start_s
    for row in rows.values():
        row.models.sort()
        row.alerts.sort()
        if check_links and row.dashboard_url:
            row.dashboard_reachable = reachable(row.dashboard_url)
    return sorted(rows.values(), key=lambda r: (r.host, r.instance))


def this_host_instances(listen: str | None) -> set[str]:
    """The ``instance`` values under which Prometheus may scrape this machine's collector (its listen address)."""
    if not listen:
        return set()
    host, _, port = listen.rpartition(":")
    names = {listen}
    if port:
        names |= {f"{n}:{port}" for n in (socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1")}
        if host not in ("0.0.0.0", "[::]", "127.0.0.1", "localhost"):
            names.add(f"{host}:{port}")
    return names


@dataclass(frozen=True)
class FiringAlert:
    name: str
    summary: str
    severity: str


def firing_alerts(base_url: str, instances: Iterable[str]) -> list[FiringAlert]:
    """Alerts firing now for these instances, from Prometheus's /api/v1/alerts (with their summaries)."""
    wanted = set(instances)
    alerts = _api(base_url, "alerts", {}).get("alerts", [])
    out = []
    for a in alerts if isinstance(alerts, list) else []:
        labels, annotations = a.get("labels", {}), a.get("annotations", {})
        if a.get("state") == "firing" and labels.get("instance") in wanted:
            out.append(FiringAlert(labels.get("alertname", "?"), annotations.get("summary", ""), labels.get("severity", "")))
    return sorted(set(out), key=lambda f: f.name)


def percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.0f}%"


def watts(power_w: float | None) -> str:
    return "—" if power_w is None else f"{power_w:.0f} W"
