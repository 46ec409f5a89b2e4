"""pages/fleet: the Hosts page's PromQL client, apart from a browser (the real Prometheus is in tests/e2e)."""

from __future__ import annotations

import socket

import pytest

from pages.shared import fleet, fmt
from tests.support.ports import free_port


def test_prometheus_url_comes_from_the_environment() -> None:
    assert fleet.prometheus_url({}) is None
    assert fleet.prometheus_url({"PHASEWATCH_PROMETHEUS": "  "}) is None
    assert fleet.prometheus_url({"PHASEWATCH_PROMETHEUS": "http://prom.lan:9090/"}) == "http://prom.lan:9090"


def test_this_host_is_known_by_its_listen_address_and_names() -> None:
    names = fleet.this_host_instances("127.0.0.1:11435")
    assert {"127.0.0.1:11435", "localhost:11435", f"{socket.gethostname()}:11435"} <= names
    assert "192.168.1.5:11435" in fleet.this_host_instances("192.168.1.5:11435")
    assert fleet.this_host_instances(None) == set()


def test_an_unreachable_prometheus_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(fleet.PrometheusError, match=f"cannot reach Prometheus at {url}"):
        fleet.host_rows(url, 0.0)
    assert not fleet.reachable(url)
    assert not fleet.reachable("javascript:alert(1)")  # only http(s) links are ever offered


def test_unknown_figures_read_as_a_dash() -> None:
    assert fmt.gb(None) == fleet.percent(None) == fleet.watts(None) == "—"
    assert fmt.gb(25.8e9) == "25.8 GB" and fleet.percent(0.5) == "50%" and fleet.watts(199.6) == "200 W"
    assert fleet._number("NaN") is None and fleet._number("+Inf") is None and fleet._number("2.5") == 2.5
