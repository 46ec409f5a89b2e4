"""The ops that write a batch of rows share one shape (store.ops.RowsOp): any iterable in, a tuple kept, a weight of
one record per row (or one for a single reading). A generator is read once, when the op is made, so a queued op
writes every row."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from analysis.records import GpuSample, InstalledModel
from store import ops
from store.ops import OP_BYTES, Op, PutGpuSamples, PutInstalledModels, PutLoadedModels, PutOllamaSettings, RowsOp
from store.schema import db_path
from store.writer import StoreWriter


def op_classes() -> list[type[Op[Any]]]:
    return [c for c in vars(ops).values() if isinstance(c, type) and issubclass(c, Op) and c not in (Op, RowsOp)]


def test_every_op_holding_a_batch_is_a_rows_op() -> None:
    """A new op with a tuple of rows takes the shared shape instead of writing its own __init__ and weight."""
    not_rows = {"DeleteDirect"}  # deletes by id, given as a tuple by its one caller: it writes no rows
    batch_ops = {
        c.__name__
        for c in op_classes()
        if any("tuple[" in str(f.type) for f in dataclasses.fields(c))  # type: ignore[arg-type]
    }
    rows_ops = {c for c in op_classes() if issubclass(c, RowsOp)}
    assert batch_ops - not_rows == {c.__name__ for c in rows_ops}
    assert len(rows_ops) == 8
    # One weight and one size for all of them, and an __init__ of their own only to take a key beside the rows.
    assert all(c.weight is RowsOp.weight and c.size_bytes is RowsOp.size_bytes for c in rows_ops)
    assert {c.__name__ for c in rows_ops if "__init__" in vars(c)} == {"PutLoadedModels", "PutRunnerPlacement"}


def gpus(n: int) -> Iterator[GpuSample]:
    return (GpuSample(1000.0 + i, 0, "GPU", "GPU-a", util_gpu_pct=50.0) for i in range(n))


def test_a_batch_from_a_generator_is_kept_and_weighed_by_its_rows() -> None:
    op = PutGpuSamples(gpus(3))
    assert op.rows == tuple(op.rows) and len(op.rows) == 3
    assert (op.weight, op.size_bytes) == (3, 3 * OP_BYTES)
    assert PutGpuSamples(gpus(3)) == op  # frozen and compared by its rows, as before
    empty = PutInstalledModels(iter(()))
    assert (empty.weight, empty.size_bytes) == (1, OP_BYTES)  # an empty list still replaces the one before


def test_a_single_reading_weighs_one_record_however_many_rows() -> None:
    assert PutLoadedModels.per_row is False and PutOllamaSettings.per_row is False
    snap = PutLoadedModels(5.0, [])
    assert (snap.ts_unix_s, snap.rows, snap.weight) == (5.0, (), 1)


def test_a_queued_generator_batch_writes_every_row(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    w = StoreWriter(path)
    try:
        w.write(PutGpuSamples(gpus(4)))
        w.write(PutInstalledModels(InstalledModel(1.0, n, n, "d" * 64, 1, "1B", "Q4_0", "llama", 1.0, ()) for n in "ab"))
    finally:
        w.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0] == 4
        assert [r[0] for r in conn.execute("SELECT name FROM installed_models ORDER BY name")] == ["a", "b"]
    finally:
        conn.close()
