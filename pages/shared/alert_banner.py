"""On every page that wants it (Live today): the Prometheus alerts firing for this machine's collector."""

from __future__ import annotations

import streamlit as st

from pages.shared import fleet, fmt
from pages.shared.fleet import FiringAlert

BANNER_REFRESH_S = 20  # Prometheus evaluates rules every 15 s by default


def alert_banner(listen: str | None) -> None:
    """On Live: alerts firing in Prometheus for this machine's collector. Nothing without PHASEWATCH_PROMETHEUS."""
    base_url = fleet.prometheus_url()
    if base_url is not None:
        _alert_banner(base_url, listen)


@st.fragment(run_every=BANNER_REFRESH_S)
def _alert_banner(base_url: str, listen: str | None) -> None:
    try:
        firing: list[FiringAlert] = fleet.firing_alerts(base_url, fleet.this_host_instances(listen))
    except fleet.PrometheusError:
        return  # the Hosts page says what is wrong with Prometheus; Live stays about this machine (asked again soon)
    if firing:
        lines = "  \n".join(f"**{fmt.md_escape(a.name)}**: {fmt.md_escape(a.summary)}" for a in firing)
        st.warning(f"Alerts firing for this host in Prometheus:  \n{lines}", icon=":material/notifications_active:")
