"""Demo mode's GPU: the sim's virtual GPU read from ``GET /sim/gpu``."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from collectors.gpu.sim import SIM_GPU_MAX_BYTES, SimGpuSource, gpu_samples_from_sim
from tests.support.ports import free_port
from tests.support.sim_process import start_sim


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on loopback answering with ``handler``; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_sim_payload_becomes_simulated_samples() -> None:
    payload = {
        "simulated": True,
        "gpus": [{"index": 0, "name": "Simulated RTX", "uuid": "GPU-s", "power_w": 120.5, "total_energy_mj": 5, "pstate": 8}],
    }
    (s,) = gpu_samples_from_sim(payload, 7.0)
    assert (s.ts_unix_s, s.name, s.uuid, s.power_w, s.pstate, s.simulated) == (7.0, "Simulated RTX", "GPU-s", 120.5, 8, True)
    assert gpu_samples_from_sim({"simulated": True, "gpus": []}, 0) == []  # --hardware cpu


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("text", "did not return a JSON object or list of GPUs"),
        ({"gpus": "none"}, "did not return a JSON object or list of GPUs"),
        ([1], "not a JSON object"),
        ({"gpus": [{"power_w": "hot"}]}, "power_w='hot'"),
        ({"gpus": [{"index": True}]}, "index=True"),
        ({"gpus": [{"name": 3}]}, "name=3"),
        ([{"temperature_c": float("nan")}], "temperature_c=nan"),
    ],
)
def test_bad_payloads_are_a_clear_value_error(bad: object, needle: str) -> None:
    with pytest.raises(ValueError, match="/sim/gpu") as err:
        gpu_samples_from_sim(bad, 0)
    assert needle in str(err.value)


def test_reads_the_running_sim_and_says_when_it_cannot() -> None:
    with start_sim("--hardware", "rtx-3090") as sim:
        live = SimGpuSource(sim.base_url, clock=lambda: 1.0)
        (s,) = live.sample()
        assert s.simulated and "RTX 3090" in s.name and s.mem_total_bytes and s.mem_total_bytes > 20e9
        assert live.state.kind == "simulated"
        (again,) = live.sample()  # over the same kept-alive connection
        assert again.mem_total_bytes == s.mem_total_bytes
    # The sim gone: the kept connection fails, and so does a new one; the state says why.
    assert live.sample() == [] and live.state.message and "cannot read" in live.state.message
    dead = SimGpuSource(f"http://127.0.0.1:{free_port()}")
    assert dead.sample() == []
    assert dead.state.kind == "simulated" and dead.state.message and "cannot read" in dead.state.message


def test_an_answer_past_the_bound_or_not_200_is_refused() -> None:
    answers = [(200, b"[" + b" " * SIM_GPU_MAX_BYTES + b"]"), (503, b"{}")]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.pop(0)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        source = SimGpuSource(url)
        assert source.sample() == []
        assert source.state.message and f"over {SIM_GPU_MAX_BYTES} bytes" in source.state.message
        assert source.sample() == []
        assert source.state.message and "HTTP 503" in source.state.message


def test_a_kept_connection_the_server_closed_costs_no_sample() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # says keep-alive, then closes: as a server's idle timeout does

        def do_GET(self) -> None:
            body = b'{"gpus": [{"name": "sim", "mem_total_bytes": 1000}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        source = SimGpuSource(url)
        try:
            for _ in range(3):
                (s,) = source.sample()
                assert s.mem_total_bytes == 1000
                assert source.state.message and "cannot read" not in source.state.message
        finally:
            source.close()
