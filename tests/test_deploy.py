"""deploy/: the alert rules pass promtool's checks and unit tests; the Prometheus config and dashboard hold together."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus_process import require_tool

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
# The alerts issue 17 asks for, by name.
ALERTS = {
    "PhasewatchVramHigh",
    "PhasewatchGpuHot",
    "PhasewatchGpuThrottled",
    "PhasewatchModelPartlyInSystemMemory",
    "PhasewatchDecodeBelowCeiling",
    "PhasewatchInterTokenGapHigh",
    "PhasewatchOllamaDown",
    "PhasewatchCollectorDown",
    "PhasewatchStoreWriteErrors",
}


def _promtool(*args: str, cwd: Path = DEPLOY) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_check() -> None:
    check = _promtool("check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(ALERTS)} rules found" in check.stdout


def test_every_alert_has_a_unit_test_that_fires_then_resolves() -> None:
    run = _promtool("test", "rules", "alerts_test.yml")
    assert run.returncode == 0, run.stdout + run.stderr
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names == ALERTS
    tests = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())["tests"]
    for name in ALERTS:
        cases = [c for t in tests for c in t["alert_rule_test"] if c["alertname"] == name]
        fired = [c["eval_time"] for c in cases if c["exp_alerts"]]
        resolved = [c["eval_time"] for c in cases if not c["exp_alerts"]]
        assert fired and resolved, name
        to_min = lambda t: int(re.fullmatch(r"(\d+)m", t).group(1))  # type: ignore[union-attr]  # noqa: E731
        assert max(map(to_min, resolved)) > min(map(to_min, fired)), f"{name}: resolves after it fired"


@pytest.mark.slow
def test_the_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """A mutation: each threshold moved, the unit tests fail (they measure the rules, not only run them)."""
    text = (DEPLOY / "alerts.yml").read_text()
    for old, new in (("> 0.93", "> 0.99"), ("> 87", "> 95"), ("< 0.5", "< 0.2"), (") > 1\n", ") > 5\n")):
        assert old in text
        (tmp_path / "alerts.yml").write_text(text.replace(old, new))
        shutil.copy(DEPLOY / "alerts_test.yml", tmp_path)
        assert _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path).returncode != 0, old


def test_prometheus_config_checks(tmp_path: Path) -> None:
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(DEPLOY / name, tmp_path)
    (tmp_path / "phasewatch.token").write_text("a-token-for-the-check\n")
    check = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_compose_and_grafana_provisioning_hold_together() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    assert set(compose["services"]) == {"prometheus", "grafana"}
    for service in compose["services"].values():
        for volume in service["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./") and not source.endswith(".token"):
                assert (DEPLOY / source).exists(), source
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "phasewatch.json").read_text())
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for wanted in (
        "phases per model",
        "time to first token",
        "time per output token",
        "prefill vs decode",
        "tokens per second",
        "vram",
        "power",
        "energy per token",
    ):
        assert wanted in titles, wanted
