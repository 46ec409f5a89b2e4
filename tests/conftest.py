"""Fixtures for every test: a data folder the app reads, sim processes started with any arguments, and the
recording proxy in front of the module's sim. Helpers that are not fixtures live in tests/support/.

A module picks its sim's arguments with a marker, or asks the factory for more than one:

    pytestmark = pytest.mark.sim_args("--hardware", "rtx-3090", "--num-parallel", "2")

    def test_x(sim: SimProcess) -> None: ...            # that module's sim, started once for the module
    def test_y(start_sims: SimFactory) -> None:          # sims of its own, stopped after the module
        big = start_sims("--hardware", "h100")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.proxy_process import ProxyChild, run_proxy_child
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimFactory, SimProcess, start_sim

DEFAULT_SIM_ARGS = ("--hardware", "rtx-4090")


@pytest.fixture(scope="module")
def start_sims() -> Iterator[SimFactory]:
    """Start ``python -m sim *args`` on a free port; every sim started this way stops after the module."""
    with contextlib.ExitStack() as stack:
        yield lambda *args: stack.enter_context(start_sim(*args))


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest, start_sims: SimFactory) -> SimProcess:
    """One sim for the whole module, with the arguments of the module's ``sim_args`` marker (an RTX 4090 if none)."""
    marker = request.node.get_closest_marker("sim_args")
    return start_sims(*(marker.args if marker else DEFAULT_SIM_ARGS))


@pytest.fixture(scope="module")
def proxy(sim: SimProcess) -> Iterator[ProxyThread]:
    """The recording proxy on a free port in this process, in front of the module's sim."""
    with run_proxy(sim.base_url) as p:
        yield p


@pytest.fixture(scope="module")
def proxy_child(sim: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyChild]:
    """The recording proxy in its own process, in front of the module's sim: for tests that hold its stamps to
    sim's truth, which a proxy sharing this process's GIL with the client misses on a loaded machine."""
    with run_proxy_child(sim.base_url, tmp_path_factory.mktemp("proxy")) as p:
        yield p


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data folder the app reads (PHASEWATCH_DATA), with no collector started and nothing from the
    environment (demo, OLLAMA_HOST, PHASEWATCH_LISTEN) leaking into the test."""
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    for k in ("PHASEWATCH_DEMO", "OLLAMA_HOST", "PHASEWATCH_LISTEN"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def embed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma's GGUF with ``<arch>.pooling_type`` added: an embedding model (none ships here), written once per run
    (tests/support/embed_gguf.py). Skips, as the engine tests do, when the GGUF is missing."""
    from tests.support.embed_gguf import with_pooling
    from tests.support.engine_process import require_llama_server

    _, src = require_llama_server()
    return with_pooling(src, tmp_path_factory.mktemp("embed-gguf") / "embedgemma.gguf")
