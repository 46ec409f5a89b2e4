"""A real Prometheus scrapes two collectors in front of two sims with different hardware (issue 17).

sim --hardware rtx-4090 → collector A ┐
sim --hardware rtx-3060 → collector B ┴→ prometheus (Debian's binary, loopback, temporary config) → PromQL

Both collectors run with PHASEWATCH_TOKEN; Prometheus sends it as a bearer credential. What PromQL says is
held against what was sent and against each sim's own record of what happened (``/sim/truth``).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from prometheus_client.parser import text_string_to_metric_families

from collectors.lock import read_lock
from collectors.metrics import TTFT_BUCKETS_S
from pages.shared import fleet as fleet_data
from pages.shared import fmt
from tests.e2e.support import ARTIFACTS, REPO, START_TIMEOUT_S, _stop, run_app, screenshot, wait_ready, wait_until
from tests.support.ports import free_port
from tests.support.prometheus_process import Prometheus, require_tool, start_prometheus
from tests.support.sim_process import SimProcess, start_sim

pytestmark = pytest.mark.slow  # the module's fleet: Prometheus, three sims and their collectors

TOKEN = "fleet-test-token-0123456789"
MODEL = "llama3.2:latest"
SENT = {"rtx-4090": 7, "rtx-3060": 5}  # requests sent through each host's collector
NUM_PREDICT = 120
# A rule that fires at once for host A only: the Hosts page and the Live banner show firing alerts.
TEST_RULES = """groups:
  - name: fleet-test
    rules:
      - alert: FleetTestAlert
        expr: phasewatch_ollama_up{host="gpu-a"} == 1
        labels: {severity: warning}
        annotations: {summary: "test alert on gpu-a"}
"""


@dataclass
class Host:
    name: str  # the `host` label
    hardware: str
    sim: SimProcess
    listen: str  # the collector's host:port (= Prometheus's instance label)
    data_dir: Path
    sent: int = 0


@dataclass
class Fleet:
    prom: Prometheus
    hosts: list[Host]


def _get(url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _generate(listen: str, i: int) -> None:
    body = {
        "model": MODEL,
        "prompt": f"question {i}: " + "tell me about the sea " * (20 + 10 * i),
        "stream": True,
        "options": {"num_predict": NUM_PREDICT, "seed": i},
    }
    req = urllib.request.Request(
        f"http://{listen}/api/generate",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        r.read()


def _start_collector(sim: SimProcess, data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    listen = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}
    env.update(PHASEWATCH_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collectors",
                "--ollama",
                sim.base_url,
                "--listen",
                listen,
                "--data",
                str(data_dir),
                "--demo",
                "--interval",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == listen, START_TIMEOUT_S, "the collector")
    return proc, listen


def _prometheus_config(dir_: Path, hosts: list[Host], app_urls: dict[str, str]) -> None:
    (dir_ / "phasewatch.token").write_text(TOKEN + "\n")
    (dir_ / "alerts.yml").write_text((REPO / "deploy" / "alerts.yml").read_text())
    (dir_ / "test_rules.yml").write_text(TEST_RULES)
    targets = "".join(
        f"""      - targets: ["{h.listen}"]
        labels: {{host: "{h.name}", dashboard_url: "{app_urls.get(h.name, "http://127.0.0.1:1")}"}}
"""
        for h in hosts
    )
    (dir_ / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yml, test_rules.yml]
scrape_configs:
  - job_name: phasewatch
    metrics_path: /phasewatch/metrics
    authorization: {{type: Bearer, credentials_file: phasewatch.token}}
    static_configs:
{targets}""")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_tool("prometheus")
    root = tmp_path_factory.mktemp("fleet")
    with start_sim("--hardware", "rtx-4090") as sim_a, start_sim("--hardware", "rtx-3060") as sim_b:
        procs: list[subprocess.Popen[bytes]] = []
        hosts: list[Host] = []
        try:
            for name, hw, sim in (("gpu-a", "rtx-4090", sim_a), ("gpu-b", "rtx-3060", sim_b)):
                data = root / name
                proc, listen = _start_collector(sim, data, root / f"{name}.log")
                procs.append(proc)
                hosts.append(Host(name, hw, sim, listen, data))
            # Host A's own dashboard is reachable (a real Phasewatch app on its data); host B's is not.
            app_env = {"PHASEWATCH_COLLECTOR": "off"}
            with run_app(hosts[0].data_dir, root / "app-a.log", app_env) as app_a:
                _prometheus_config(root, hosts, {"gpu-a": app_a})
                with start_prometheus(root) as prom:
                    wait_until(lambda: len(prom.query('up{job="phasewatch"} == 1')) == 2, 60, "both targets up")
                    with ThreadPoolExecutor(4) as pool:
                        jobs = [pool.submit(_generate, h.listen, i) for h in hosts for i in range(SENT[h.hardware])]
                        for job in jobs:
                            job.result()
                    for h in hosts:
                        h.sent = SENT[h.hardware]
                    wait_until(
                        lambda: _requests_by_host(prom) == {h.listen: float(h.sent) for h in hosts},
                        60,
                        "Prometheus to scrape every request",
                    )
                    time.sleep(3)  # a few more scrapes after the last request: rate() windows see it end
                    yield Fleet(prom, hosts)
        finally:
            for proc in procs:
                _stop(proc)


def _requests_by_host(prom: Prometheus) -> dict[str, float]:
    return {r["metric"]["instance"]: float(r["value"][1]) for r in prom.query("sum by (instance) (phasewatch_requests_total)")}


def _truth(sim: SimProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=10) as r:
        body = json.load(r)
    records = body["requests"]
    return [t for t in records if t["endpoint"] == "/api/generate" and t["token_written_ns"]]


def _bucket_index(value: float) -> int:
    return next((i for i, b in enumerate(TTFT_BUCKETS_S) if value <= b), len(TTFT_BUCKETS_S))


def test_request_counts_equal_what_was_sent(fleet: Fleet) -> None:
    assert _requests_by_host(fleet.prom) == {h.listen: float(h.sent) for h in fleet.hosts}
    by_host = {
        r["metric"]["host"]: float(r["value"][1])
        for r in fleet.prom.query('sum by (host) (phasewatch_requests_total{outcome="ok",model="llama3.2:latest"})')
    }
    assert by_host == {"gpu-a": 7.0, "gpu-b": 5.0}


def test_ttft_p50_within_one_bucket_of_sim_truth(fleet: Fleet) -> None:
    result = {
        r["metric"]["instance"]: float(r["value"][1])
        for r in fleet.prom.query(
            "histogram_quantile(0.5, sum by (instance, le) (gen_ai_server_time_to_first_token_seconds_bucket))"
        )
    }
    for h in fleet.hosts:
        truth = [(t["token_written_ns"][0] - t["received_ns"]) / 1e9 for t in _truth(h.sim)]
        assert len(truth) == h.sent
        true_p50 = statistics.median(truth)
        estimate = result[h.listen]
        assert abs(_bucket_index(estimate) - _bucket_index(true_p50)) <= 1, (h.hardware, estimate, true_p50)


def test_decode_rate_per_host_within_5_percent_of_truth(fleet: Fleet) -> None:
    expr = (
        'sum by (instance) (phasewatch_decode_tokens_total) / sum by (instance) (phasewatch_phase_seconds_total{phase="decode"})'
    )
    measured = {r["metric"]["instance"]: float(r["value"][1]) for r in fleet.prom.query(expr)}
    rates = {}
    for h in fleet.hosts:
        truth = _truth(h.sim)
        intervals = sum(len(t["token_sampled_ns"]) - 1 for t in truth)
        seconds = sum((t["token_sampled_ns"][-1] - t["token_sampled_ns"][0]) / 1e9 for t in truth)
        rates[h.hardware] = intervals / seconds
        assert measured[h.listen] == pytest.approx(rates[h.hardware], rel=0.05), h.hardware
    assert rates["rtx-4090"] > 1.5 * rates["rtx-3060"]  # two different GPUs, told apart


def test_decode_fraction_of_the_ceiling_per_host(fleet: Fleet) -> None:
    """The sim decodes at its profile's bandwidth efficiency (0.7 of the ceiling for Q4): p50 lands near it."""
    ratios = {
        r["metric"]["instance"]: float(r["value"][1])
        for r in fleet.prom.query(
            "histogram_quantile(0.5, sum by (instance, le) (phasewatch_request_decode_ceiling_ratio_bucket))"
        )
    }
    counts = {
        r["metric"]["instance"]: float(r["value"][1])
        for r in fleet.prom.query("sum by (instance) (phasewatch_request_decode_ceiling_ratio_count)")
    }
    for h in fleet.hosts:
        assert counts[h.listen] == h.sent
        assert 0.4 < ratios[h.listen] <= 1.0, (h.hardware, ratios[h.listen])


def _dashboard_exprs() -> list[str]:
    dash = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "phasewatch.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    return exprs


def test_every_dashboard_expression_evaluates_and_returns_data(fleet: Fleet) -> None:
    empty = []
    for expr in _dashboard_exprs():
        promql = expr.replace("$__rate_interval", "5m").replace("$instance", ".*")
        result = fleet.prom.query(promql)  # raises on an error
        finite = [r for r in result if math.isfinite(float(r["value"][1]))]
        if not finite:
            empty.append(promql)
    assert not empty, empty


def test_exposition_parses_and_passes_promtool_check_metrics(fleet: Fleet) -> None:
    promtool = require_tool("promtool")
    status, body = _get(f"http://{fleet.hosts[0].listen}/phasewatch/metrics")
    assert status == 200
    text = body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["gen_ai_server_time_to_first_token_seconds"].type == "histogram"
    assert not any(f.type == "summary" for f in families.values())
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_scrape_without_the_token_is_refused(fleet: Fleet) -> None:
    listen = fleet.hosts[1].listen
    assert _get(f"http://{listen}/phasewatch/metrics", token=None)[0] == 401
    assert _get(f"http://{listen}/phasewatch/metrics", token="wrong-" + TOKEN)[0] == 401


def _row_texts(page: Any) -> list[str]:
    return [t.strip() for t in page.locator('[data-testid="stHorizontalBlock"]').all_inner_texts()]


@pytest.mark.browser
def test_hosts_page_shows_both_hosts(fleet: Fleet, browser: Browser, tmp_path: Path) -> None:
    env = {"PHASEWATCH_PROMETHEUS": fleet.prom.url, "PHASEWATCH_COLLECTOR": "off"}
    with run_app(fleet.hosts[0].data_dir, tmp_path / "app.log", env) as url:
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        page = context.new_page()
        try:
            page.goto(url + "/hosts")
            wait_ready(page)
            page.get_by_text("gpu-b", exact=False).first.wait_for(timeout=45_000)
            wait_ready(page)
            text = page.inner_text("body")
            rows = {r.instance: r for r in fleet_data.host_rows(fleet.prom.url, time.time(), check_links=False)}
            for h in fleet.hosts:
                assert h.name in text and h.listen in text
                row = rows[h.listen]  # the page shows what the same PromQL gives
                assert row.decode_tok_s is not None and fmt.rate(row.decode_tok_s) in text, h.name
                assert fmt.gb(row.vram_total_bytes) in text and fleet_data.watts(row.power_w) in text
            assert "llama3.2:latest" in text
            assert "FleetTestAlert" in text  # firing on gpu-a only
            assert re.search(r"\d+(\.\d+)? tok/s", text)
            link = page.locator("a", has_text="gpu-a")
            assert link.count() >= 1  # gpu-a's own dashboard answers: its name links there
            assert page.locator("a", has_text="gpu-b").count() == 0  # gpu-b's does not
            page.wait_for_function(
                "document.querySelectorAll('[data-testid=\"stPlotlyChart\"]').length >= 4", timeout=60_000
            )  # two sparklines per host
            screenshot(page, "hosts")

            page.goto(url + "/")  # Live: this host (gpu-a) has an alert firing
            wait_ready(page)
            page.get_by_text("FleetTestAlert", exact=False).first.wait_for(timeout=90_000)  # refreshed every 20 s
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "live-alert-banner.png"))
        finally:
            context.close()
