"""Live and Why in Debian's Chromium with a fake AMD GPU and a fake Apple GPU under the real collector.

AMD: ``python -m collectors`` (not demo) with ``PHASEWATCH_SYSFS_ROOT`` on a fake sysfs tree whose
busy/power files a thread keeps rewriting, as the driver does; NVML and amdsmi are absent here, so
the collector's own chooser lands on the sysfs reader. Apple: the same collector told it is on macOS
arm64 and handed the macmon-lib fake (``tests/support/fake_gpu_collector.py``). Ollama is the sim in
both. Screenshots: ``gpu-<source>-live.png`` and ``gpu-<source>-why.png`` under ``$PHASEWATCH_ARTIFACTS``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ollama
import pytest
from playwright.sync_api import Page

from collectors.lock import read_lock
from store import queries
from store.schema import db_path
from tests.e2e.support import REPO, START_TIMEOUT_S, UI_TIMEOUT_MS, _stop, run_app, screenshot, wait_ready, wait_until
from tests.support.fake_gpu_collector import sim_gpu
from tests.support.fake_sysfs import write_tree
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

pytestmark = pytest.mark.browser

MODEL = "llama3.2:latest"


@dataclass
class GpuStack:
    source: str
    app_url: str
    proxy: str
    data_dir: Path


@contextlib.contextmanager
def _amd_driver(root: Path, sim_url: str) -> Iterator[None]:
    """Rewrite the busy and power files every 0.3 s from the sim's virtual GPU, as the amdgpu driver's readings move."""
    device = root / "class/drm/card1/device"
    hwmon = device / "hwmon/hwmon3/power1_average"
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.3):
            with contextlib.suppress(OSError):
                busy, mem_busy, watts = sim_gpu(sim_url)
                (device / "gpu_busy_percent").write_text(f"{round(busy * 100)}\n")
                (device / "mem_busy_percent").write_text(f"{round(mem_busy * 100)}\n")
                hwmon.write_text(f"{round(watts * 1e6)}\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


@pytest.fixture(scope="module", params=["amd", "apple"])
def gpu_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuStack]:
    source = request.param
    data_dir = tmp_path_factory.mktemp(f"phasewatch-{source}")
    logs = tmp_path_factory.mktemp("logs")
    sysfs = write_tree(tmp_path_factory.mktemp("sys"))
    env = {"PHASEWATCH_SYSFS_ROOT": str(sysfs) if source == "amd" else str(logs)}  # Apple: an empty tree, no AMD card
    module = ["collectors"] if source == "amd" else ["tests.support.fake_gpu_collector", "apple"]
    # The sim's nearest profiles: an RTX 3090 (936 GB/s) for the RX 7900 XTX (960 GB/s), an M3 Max for the M3 Max.
    hardware = "rtx-3090" if source == "amd" else "m3-max"
    with start_sim("--hardware", hardware) as sim, _amd_driver(sysfs, sim.base_url):
        proxy = f"127.0.0.1:{free_port()}"
        with open(logs / "collector.log", "wb") as log:
            collector = subprocess.Popen(
                [sys.executable, "-m", *module, "--ollama", sim.base_url, "--listen", proxy, "--data", str(data_dir)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**_base_env(), **env},
            )
        try:
            wait_until(
                lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector's lock"
            )
            wait_until(lambda: db_path(data_dir).exists(), START_TIMEOUT_S, "the store")
            app_env = {"OLLAMA_HOST": sim.base_url, "PHASEWATCH_LISTEN": proxy}
            with run_app(data_dir, logs / "app.log", app_env) as url:
                yield GpuStack(source, url, proxy, data_dir)
        finally:
            _stop(collector)


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PHASEWATCH_")}


def _send(stack: GpuStack) -> None:
    client = ollama.Client(host=f"http://{stack.proxy}", timeout=120)
    for words, reply in ((60, 40), (600, 60), (1500, 50), (200, 80)):
        prompt = "Summarise this: " + " ".join(["quarterly revenue grew in every region"] * (words // 6 + 1))
        list(client.generate(model=MODEL, prompt=prompt, stream=True, options={"num_predict": reply, "num_ctx": 8192}))


def _ready(stack: GpuStack) -> bool:
    conn = queries.open_readonly(stack.data_dir)
    try:
        beat = queries.latest_heartbeat(conn)
        rows = queries.rate_rows(conn, MODEL, 0.0)
        return beat is not None and len(rows) >= 4 and queries.model_info(conn, MODEL) is not None
    finally:
        conn.close()


EXPECT = {
    "amd": ("AMD Radeon RX 7900 XTX", "read through AMD (amdgpu sysfs)", "amd-sysfs"),
    "apple": ("Apple M3 Max", "read through Apple Silicon (macmon)", "macmon"),
}
UNIFIED = "Unified memory: the VRAM line is what Ollama's models hold of system memory"


def test_live_and_why_with_a_fake_gpu_source(gpu_stack: GpuStack, page: Page) -> None:
    name, sidebar_line, kind = EXPECT[gpu_stack.source]
    _send(gpu_stack)
    wait_until(lambda: _ready(gpu_stack), 60, "the requests and the heartbeat in the store")
    conn = queries.open_readonly(gpu_stack.data_dir)
    try:
        beat = queries.latest_heartbeat(conn)
        assert beat is not None and beat.gpu_state == kind, beat
    finally:
        conn.close()

    page.goto(gpu_stack.app_url)
    wait_ready(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    main = page.locator('[data-testid="stMain"]')
    wait_until(lambda: sidebar_line in sidebar.inner_text(), 30, "the sidebar naming the source")
    assert f"GPU 0 · {name}" in sidebar.inner_text()
    wait_until(lambda: page.locator('[data-testid="stPlotlyChart"]').count() >= 1, 30, "the GPU timeline")
    wait_until(
        lambda: (
            f"GPU 0: {name}"
            in page.evaluate("""() => Array.from(document.querySelectorAll(
        '[data-testid="stPlotlyChart"] .js-plotly-plot')).map(gd => gd.layout.title && gd.layout.title.text).join('|')""")
        ),
        30,
        "the GPU chart titled with the card's name",
    )

    def drawn_lines() -> dict[str, int]:
        traces = page.evaluate("""() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot'))
            .flatMap(gd => (gd._fullData || []).map(t => [t.name, t._length]))""")
        return {n: k for n, k in traces}

    # A refreshed chart is drawn anew: wait for one drawing that has the lines.
    lines = wait_until(
        lambda: (d := drawn_lines()).get("GPU busy (% of time)", 0) >= 2 and d.get("power draw", 0) >= 2 and d,
        30,
        "the GPU chart's lines drawn",
    )
    if gpu_stack.source == "amd":
        assert "memory clock" in lines and "VRAM used" in lines
    else:
        assert "VRAM used by Ollama" in lines and "memory clock" not in lines  # macmon has no memory clock
    assert (UNIFIED in main.inner_text()) is (gpu_stack.source == "apple")
    # Paused, the timeline stops being redrawn each second, so the screenshot catches it drawn.
    sidebar.get_by_text("Pause live updates").click(force=True, timeout=UI_TIMEOUT_MS)
    wait_ready(page)
    screenshot(page, f"gpu-{gpu_stack.source}-live")

    page.locator('[data-testid="stSidebarNav"] a', has_text="Why").click()
    wait_ready(page)
    wait_until(lambda: "faster than decode." in main.inner_text(), 60, "the Why page's ratio sentence")
    text = main.inner_text()
    assert page.locator('[data-testid="stException"]').count() == 0
    assert name in text
    if gpu_stack.source == "amd":
        assert "table row rx-7900-xtx" in text and "(datasheet)" in text
        assert "memory clock now 1,249 of 1,249 MHz" in text
        assert "not the bus width, so the bandwidth is the datasheet's" in text
    else:
        assert UNIFIED in text
    screenshot(page, f"gpu-{gpu_stack.source}-why")
