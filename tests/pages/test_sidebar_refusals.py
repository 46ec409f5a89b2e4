"""The sidebar says when the proxy refused requests in the last hour (issue 30), read from the collector's heartbeat
like every other source line; it says nothing when there were none."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import CollectorInfo
from store.ops import PutHeartbeat
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60  # generous: the test machine is shared


@pytest.mark.parametrize("refused", ["2 × 400 malformed, 1 × 503 too many connections", None])
def test_the_sidebar_shows_the_last_hours_refusals_only_when_there_are_any(data_dir: Path, refused: str | None) -> None:
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(
            PutHeartbeat(
                CollectorInfo(
                    ts_unix_s=time.time(),
                    pid=4242,
                    listen="127.0.0.1:11435",
                    ollama_url="http://127.0.0.1:11434",
                    data_dir=str(data_dir),
                    gpu_state="none",
                    proxy_refused=refused,
                )
            )
        )
    finally:
        w.close()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = [c.value for c in at.sidebar.caption]
    said = [c for c in captions if c.startswith("Refused in the last hour")]
    if refused is None:
        assert said == []
    else:
        assert said == [
            "Refused in the last hour: :orange[2 × 400 malformed, 1 × 503 too many connections]. "
            "The collector's log says why, with each client's address."
        ]
