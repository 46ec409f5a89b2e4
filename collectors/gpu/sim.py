"""The simulator's virtual GPU (demo mode): ``GET {sim}/sim/gpu`` read into samples marked simulated."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from analysis.records import GpuKind, GpuSample
from collectors.gpu.state import GpuState

__all__ = ["SimGpuSource", "gpu_samples_from_sim"]

SIM_GPU_TIMEOUT_S = 2.0
SIM_GPU_MAX_BYTES = 256 * 1024  # an answer past this is not the sim's few GPUs: refused, not read on

_SIM_TEXT_FIELDS = ("name", "uuid")
_SIM_INT_FIELDS = (
    "index",
    "mem_used_bytes",
    "mem_total_bytes",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "mem_bus_width_bits",
    "pstate",
    "throttle_reasons",
    "ollama_mem_bytes",
)
_SIM_FLOAT_FIELDS = (
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "power_limit_w",
    "energy_j",
    "temperature_c",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
)


def _sim_gpu(item: object, position: int, ts_unix_s: float) -> GpuSample:
    if not isinstance(item, dict):
        raise ValueError("/sim/gpu returned a GPU that is not a JSON object")
    values: dict[str, Any] = {"index": position, "name": "simulated GPU", "uuid": f"SIM-{position}"}
    for key, value in item.items():
        if value is None or key not in (*_SIM_TEXT_FIELDS, *_SIM_INT_FIELDS, *_SIM_FLOAT_FIELDS):
            continue  # unknown keys (e.g. total_energy_mj) and absent readings are skipped
        ok = (
            isinstance(value, str)
            if key in _SIM_TEXT_FIELDS
            else isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
        if not ok:
            raise ValueError(f"/sim/gpu returned {key}={value!r}, which is not a valid reading")
        values[key] = int(value) if key in _SIM_INT_FIELDS else float(value) if key in _SIM_FLOAT_FIELDS else value
    return GpuSample(ts_unix_s=ts_unix_s, simulated=True, **values)


def gpu_samples_from_sim(payload: Any, ts_unix_s: float) -> list[GpuSample]:
    """Turn a ``GET /sim/gpu`` body into samples marked simulated.

    Accepts ``{"gpus": [...]}``, a list of GPU objects, or one GPU object; keys are
    GpuSample's field names. Raises ValueError, naming the field, on anything else.
    """
    if isinstance(payload, dict) and isinstance(payload.get("gpus"), list):
        items = payload["gpus"]
    elif isinstance(payload, list):
        items = payload
    elif isinstance(payload, dict) and "gpus" not in payload:
        items = [payload]
    else:
        raise ValueError("/sim/gpu did not return a JSON object or list of GPUs")
    return [_sim_gpu(item, i, ts_unix_s) for i, item in enumerate(items)]


class SimGpuSource:
    """Reads the simulator's virtual GPU from ``GET {base_url}/sim/gpu`` (demo mode).

    Blocking, over one kept-alive connection: the collector calls it in its tick's worker thread with the other
    samplers, where an aiohttp request on the event loop cost the idle collector a tenth of its CPU (bench/README.md).
    """

    def __init__(self, base_url: str, *, clock: Callable[[], float] = time.time, timeout_s: float = SIM_GPU_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(base_url.rstrip("/") + "/sim/gpu")
        self._url = parts.geturl()
        self._https = parts.scheme == "https"
        self._host, self._port, self._path = parts.hostname or "127.0.0.1", parts.port, parts.path
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._clock = clock
        self.state = GpuState(GpuKind.SIMULATED, "the simulator's virtual GPU (demo mode)")

    def sample(self) -> list[GpuSample]:
        """Samples, or [] when the sim cannot be read (the state message says why)."""
        try:
            try:
                body = self._get()
            except (OSError, http.client.HTTPException):
                if self._conn is None:
                    raise
                self.close()  # the kept connection may have been closed by the sim since: once more on a new one
                body = self._get()
            payload = json.loads(body)
            samples = gpu_samples_from_sim(payload, self._clock())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()  # the next sample opens a new connection
            self.state = GpuState(GpuKind.SIMULATED, f"cannot read {self._url}: {exc or type(exc).__name__}")
            return []
        self.state = GpuState(GpuKind.SIMULATED, "the simulator's virtual GPU (demo mode)")
        return samples

    def _get(self) -> bytes:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout_s)
        self._conn.request("GET", self._path)
        resp = self._conn.getresponse()
        body = resp.read(SIM_GPU_MAX_BYTES + 1)
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        if len(body) > SIM_GPU_MAX_BYTES:
            raise ValueError(f"an answer over {SIM_GPU_MAX_BYTES} bytes")
        return body

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
