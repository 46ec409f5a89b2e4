"""A runner's placement (``analysis.runner_placement``) as the store's rows, one per (runner port, device), and
back."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.runner_placement import DevicePlacement, RunnerPlacement, sum_known

HOST_DEVICE = "CPU"  # the stored row of what a runner kept in system memory
SOURCE_LOG = "runner log"  # the runner's own load lines, read from Ollama's log


@dataclass(frozen=True)
class RunnerDeviceRow:
    """One device's share of a runner's model as the runner's own load lines said: one row per (runner port,
    device), replaced at each load. The ``HOST_DEVICE`` row holds what stayed in system memory. The runner-wide
    ``layers_offloaded``/``layers_total`` repeat on each row. None: the runner did not say (never 0).

    The store keeps three sizes a device: ``kv_bytes`` is llama.cpp's own "context" (its memory table's column: the KV
    cache and the recurrent state together) and ``compute_bytes`` holds the output buffer too, so that every byte
    the runner allocated is in some row (``placement_rows``)."""

    ts_unix_s: float  # when the load lines were read
    port: int
    model: str | None  # the /api/ps name the runner serves, once matched
    digest: str | None
    device: str
    description: str | None
    layers_offloaded: int | None
    layers_total: int | None
    layers: int | None
    layers_estimated: bool
    model_bytes: int | None
    kv_bytes: int | None
    compute_bytes: int | None
    free_bytes_at_load: int | None
    total_bytes: int | None
    source: str


def placement_rows(
    p: RunnerPlacement, *, ts_unix_s: float, port: int, model: str | None, digest: str | None, source: str = SOURCE_LOG
) -> list[RunnerDeviceRow]:
    """The store's rows of one runner's placement."""
    common = dict(ts_unix_s=ts_unix_s, port=port, model=model, digest=digest, source=source)
    rows = [
        RunnerDeviceRow(
            device=d.device,
            description=d.description,
            layers_offloaded=p.layers_offloaded,
            layers_total=p.layers_total,
            layers=d.layers,
            layers_estimated=d.layers_estimated,
            model_bytes=d.model_bytes,
            kv_bytes=sum_known(d.kv_bytes, d.rs_bytes),
            compute_bytes=sum_known(d.compute_bytes, d.output_bytes),
            free_bytes_at_load=d.free_bytes_at_load,
            total_bytes=d.total_bytes,
            **common,  # type: ignore[arg-type]
        )
        for d in p.devices
    ]
    rows.append(
        RunnerDeviceRow(
            device=HOST_DEVICE,
            description=None,
            layers_offloaded=p.layers_offloaded,
            layers_total=p.layers_total,
            layers=None,
            layers_estimated=False,
            model_bytes=p.host_model_bytes,
            kv_bytes=sum_known(p.host_kv_bytes, p.host_rs_bytes),
            compute_bytes=p.host_output_bytes,
            free_bytes_at_load=None,
            total_bytes=None,
            **common,  # type: ignore[arg-type]
        )
    )
    return rows


def placement_from_rows(rows: list[RunnerDeviceRow] | tuple[RunnerDeviceRow, ...]) -> RunnerPlacement | None:
    """A runner's placement back from its stored rows (one port's); None for none. The recurrent state comes back
    inside ``kv_bytes`` and the output buffer inside ``compute_bytes``, as they were stored."""
    if not rows:
        return None
    first = rows[0]
    host = next((r for r in rows if r.device == HOST_DEVICE), None)
    devices = tuple(
        DevicePlacement(
            r.device,
            r.description,
            r.layers,
            r.layers_estimated,
            r.model_bytes,
            r.kv_bytes,
            r.compute_bytes,
            r.free_bytes_at_load,
            r.total_bytes,
        )
        for r in rows
        if r.device != HOST_DEVICE
    )
    return RunnerPlacement(
        first.layers_offloaded,
        first.layers_total,
        devices,
        host.model_bytes if host is not None else None,
        host.kv_bytes if host is not None else None,
        host_output_bytes=host.compute_bytes if host is not None else None,
    )
