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
from tests.support.paths import JS
from tests.support.proxy_thread import ProxyThread
from tests.support.record_checks import MODEL, NUM_PREDICT, PROMPT, call_recorded, check_embed, check_native, unload
from tests.support.sim_process import SimProcess

JS_DIR = JS

pytestmark = pytest.mark.sim_args("--hardware", "cpu", "--disk-gbs", "0.5")


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "ollama").is_dir():
        message = "node or the npm ollama package is missing: run `npm ci --prefix tests/js`"
        if os.environ.get("PHASEWATCH_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return node


def _js(node: str, proxy: ProxyThread, call: str) -> Iterator[object]:
    """Run one call of the JavaScript client (an empty iterator, for ``call_recorded``)."""
    proc = subprocess.run(
        [node, str(JS_DIR / "call.mjs"), proxy.base_url, call, MODEL, PROMPT + call, str(NUM_PREDICT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    return iter(())


@pytest.mark.parametrize("call", ["generate-stream", "chat"])
def test_js_client_generation(sim: SimProcess, proxy: ProxyThread, call: str) -> None:
    node = _node()
    unload(sim)
    rec, ph, t = call_recorded(sim, proxy, lambda: _js(node, proxy, call))
    check_native(rec, ph, t, stream=call == "generate-stream")
    assert ph.load_source == PhaseSource.OLLAMA and t["load_start_ns"] is not None


def test_js_client_embed(sim: SimProcess, proxy: ProxyThread) -> None:
    node = _node()
    rec, ph, t = call_recorded(sim, proxy, lambda: _js(node, proxy, "embed"))
    assert rec.kind is RequestKind.EMBED and rec.batch_size == 2
    check_embed(rec, ph, t, durations=True)
