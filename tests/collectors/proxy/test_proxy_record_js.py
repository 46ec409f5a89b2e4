"""Ollama's JavaScript client (npm ``ollama``, installed into tests/js by scripts/test.sh) through the proxy.

Where node or the package is missing these tests skip, and fail under ``PHASEWATCH_REQUIRE_NODE=1`` (which
scripts/test.sh sets wherever npm is installed), so a broken install never passes as a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from analysis.phases import PhaseSource
from analysis.records import RequestKind
from tests.collectors.proxy.test_proxy_record_clients import (
    MODEL,
    NUM_PREDICT,
    PROMPT,
    _call,
    _check_embed,
    _check_native,
    _unload,
)
from tests.support.paths import JS
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimProcess, start_sim

JS_DIR = JS


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "ollama").is_dir():
        message = "node or the npm ollama package is missing: run `npm ci --prefix tests/js`"
        if os.environ.get("PHASEWATCH_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return node


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with start_sim("--hardware", "cpu", "--disk-gbs", "0.5") as s:
        yield s


@pytest.fixture(scope="module")
def proxy(sim: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(sim.base_url) as p:
        yield p


def _js(node: str, proxy: ProxyThread, call: str) -> Iterator[object]:
    """Run one call of the JavaScript client (an empty iterator, for ``_call``)."""
    proc = subprocess.run(
        [node, str(JS_DIR / "call.mjs"), proxy.base_url, call, MODEL, PROMPT + call, str(NUM_PREDICT)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    return iter(())


@pytest.mark.parametrize("call", ["generate-stream", "chat"])
def test_js_client_generation(sim: SimProcess, proxy: ProxyThread, call: str) -> None:
    node = _node()
    _unload(sim)
    rec, ph, t = _call(sim, proxy, lambda: _js(node, proxy, call))
    _check_native(rec, ph, t, stream=call == "generate-stream")
    assert ph.load_source == PhaseSource.OLLAMA and t["load_start_ns"] is not None


def test_js_client_embed(sim: SimProcess, proxy: ProxyThread) -> None:
    node = _node()
    rec, ph, t = _call(sim, proxy, lambda: _js(node, proxy, "embed"))
    assert rec.kind is RequestKind.EMBED and rec.batch_size == 2
    _check_embed(rec, ph, t, durations=True)
