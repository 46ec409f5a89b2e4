"""The sidebar while the app's collector starts beside yesterday's heartbeat: "starting", not "silent for 14 h".

The heartbeat in the store is an earlier collector's until the one holding the data folder writes its first; only a
heartbeat of the holder itself (or none holding the folder) can say the collector fell silent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from analysis.records import CollectorInfo
from pages.shared.sidebar import NO_GPU_LINE
from store.ops import PutHeartbeat
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 60  # generous: the test machine is shared
# A real process takes the data folder's collector lock (as `python -m collectors` does first) and writes nothing.
HOLD = (
    "import sys, time; from pathlib import Path; from collectors.lock import CollectorLock; "
    "CollectorLock(Path(sys.argv[1])).acquire(listen='127.0.0.1:11435', ollama_url='http://127.0.0.1:11434'); "
    "print('held', flush=True); time.sleep(120)"
)


def _old_heartbeat(data_dir: Path, pid: int, age_s: float) -> None:
    w = StoreWriter(db_path(data_dir))
    try:
        info = CollectorInfo(time.time() - age_s, pid, "127.0.0.1:11435", "http://127.0.0.1:11434", str(data_dir), "none")
        w.write(PutHeartbeat(info))
    finally:
        w.close()


def _collector_line(at: AppTest) -> str:
    return next(m.value for m in at.sidebar.markdown if m.value.startswith("**Collector**"))


def test_a_collector_holding_the_folder_before_its_first_heartbeat_is_starting(data_dir: Path) -> None:
    _old_heartbeat(data_dir, pid=4242, age_s=14 * 3600)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
        assert not at.exception, [e.value for e in at.exception]
        assert _collector_line(at) == f"**Collector** · starting (process {holder.pid}): no heartbeat from it yet"
        # What the earlier collector found is not said of this one: its GPU, its runners, its refusals.
        assert "**GPU** · no samples yet" in [m.value for m in at.sidebar.markdown]
    finally:
        holder.kill()
        holder.wait()
    # Nothing holds the folder now: the old heartbeat's collector really is silent.
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert _collector_line(at) == "**Collector** · :orange[silent for 14 h]"
    assert f"**GPU** · {NO_GPU_LINE}" in [m.value for m in at.sidebar.markdown]  # as that collector last said
