"""Hosts: every collector Prometheus scrapes, one row each (shown when PHASEWATCH_PROMETHEUS is set)."""

from __future__ import annotations

import streamlit as st

from pages.hosts.ui import show_hosts
from pages.shared import common, fleet

common.context()
st.title("Hosts")
base_url = fleet.prometheus_url()
if base_url is None:
    st.info(f"Set {fleet.PROMETHEUS_ENV} to your Prometheus's URL to see every host here (deploy/ has a config).")
else:
    url: str = base_url

    @st.fragment(run_every=15)
    def hosts_part() -> None:
        show_hosts(url)

    hosts_part()
