"""The store's only writer: ``StoreWriter`` (sync) and ``BackgroundWriter`` (a thread and a queue).

Every write is an operation object of ``store.ops`` (``PutRequest``, ``PutGpuSamples``, …)
with one method, ``apply(tx)``. A batch of operations is applied in one transaction, so a
batch is either all on disk or not at all: after a failure the batch stays in memory and is
retried (on a full disk, split so that what fits commits). After each commit the files are
checked against the size bound (``RetentionPolicy.max_bytes``) and the oldest rows shed.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from analysis.running_gaps import RunningReplies
from store.no_follow import SymlinkRefused, open_no_follow
from store.ops import (
    DAY_S,
    ApplyRetention,
    Op,
    PutGpuSamples,
    PutHeartbeat,
    PutHostSample,
    PutLoadedModels,
    PutOllamaStatus,
    PutProgress,
    PutRequest,
    RetentionPolicy,
    RetentionResult,
    ShedToBound,
    Tx,
    drop_superseded,
)
from store.schema import StoreError, connect_writer

__all__ = ["DAY_S", "BackgroundWriter", "RetentionPolicy", "RetentionResult", "StoreWriter"]

log = logging.getLogger(__name__)
T = TypeVar("T")

AUTO_VACUUM_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
WAL_MIN_BYTES = 64 * 1024  # the -wal file's size kept after a checkpoint: a quarter of the bound, within these
WAL_MAX_BYTES = 4 * 1024 * 1024  # SQLite's own default checkpoint point (1000 pages of 4 KiB)
MAX_BATCH_OPS = 500  # a batch is written at the interval or once it holds this many operations, whichever first
MAX_BATCH_BYTES = 1024 * 1024  # ...or this many bytes (a 32nd of the bound when less: -wal frames are whole pages)
MIN_BATCH_BYTES = 16 * 1024
# While the store refuses writes (disk full): records kept in memory before the oldest samples are dropped,
# and requests kept before the oldest requests are (a request is far more than a sample, so only past this).
MAX_BACKLOG_RECORDS = 200_000
MAX_BACKLOG_REQUESTS = 200_000
# Records waiting in memory, by what they hold (Op.held_bytes): past this the oldest are shed, the newest kept,
# whether the store refuses writes or only takes them slower than they come (--record-text at the size bound).
# The queue and a batch held for a retry are each held within it.
MAX_BACKLOG_BYTES = 128 * 1024 * 1024
SAMPLE_OPS: tuple[type[Op[Any]], ...] = (PutGpuSamples, PutHostSample, PutLoadedModels, PutOllamaStatus, PutHeartbeat)
SHEDDABLE_OPS: tuple[type[Op[Any]], ...] = (*SAMPLE_OPS, PutRequest, PutProgress)  # records, not upkeep
SHED_MIN_GAP_S = 0.25  # after a shed that left the files over the bound: wait this long before the next
SHED_AT_FRACTION = 0.9  # shed once data and -wal pass this share of the bound: a batch then still fits below it
SHED_LOG_EVERY_S = 10.0  # the backlog's shedding is logged at most this often (with the totals)


def create_no_follow(path: Path) -> None:
    """Create the store's files (and its -wal, -shm) ourselves, never through a symbolic link.

    SQLite follows a link at the store's path (and writes its -wal beside the target): whoever could place one
    would make the collector overwrite any file it can write. ``open_no_follow`` refuses it; StoreError says so.
    """
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            fd = open_no_follow(p, os.O_RDWR | os.O_CREAT, 0o600)
        except SymlinkRefused:
            raise StoreError(
                f"{p} is a symbolic link, which the collector never writes through; delete it (check who made it) and start again"
            ) from None
        os.close(fd)


class StoreWriter:
    """Synchronous writer: ``write(op)`` is one transaction, ``apply(ops)`` one transaction for a batch.

    Not thread-safe: one thread at a time (``BackgroundWriter`` owns one in its thread).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention: RetentionPolicy | None = None,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.retention = retention or RetentionPolicy()
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        create_no_follow(self.path)
        self._conn = connect_writer(self.path, busy_timeout_ms=busy_timeout_ms)
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)  # the file opened: a path replaced or deleted later differs
        self._page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
        self._running = RunningReplies()  # running requests' sorted token gaps, extended at each in-flight write
        # The -wal file counts against the bound too: checkpoint it often enough and cut it back after each
        # checkpoint (it never shrinks by itself), both scaled to the bound.
        wal_bytes = max(WAL_MIN_BYTES, min(WAL_MAX_BYTES, self.retention.max_bytes // 4))
        self._wal_limit_bytes = wal_bytes
        self._conn.execute(f"PRAGMA journal_size_limit = {int(wal_bytes)}")
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {max(16, wal_bytes // self._page_size)}")

    def write(self, op: Op[T]) -> T:
        """Apply one operation in its own transaction; returns its result."""
        results = self._apply([op])
        result: T = results[-1]
        return result

    def apply(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """Apply a batch of operations in one transaction (all or nothing).

        Returns the results of the operations applied: those of ``drop_superseded(ops)``, in order.
        """
        return self._apply(ops)

    def set_hard_limit_bytes(self, limit_bytes: int | None) -> None:
        """Cap the file (SQLite ``max_page_count``): writes past it fail like a full disk. None lifts the cap.

        A cap below the current size holds the file at its current size.
        """
        pages = 2**31 - 2 if limit_bytes is None else max(1, limit_bytes // self._page_size)
        self._conn.execute(f"PRAGMA max_page_count = {int(pages)}")

    def used_bytes(self) -> int:
        """Bytes of the main file that hold data (free pages excluded)."""
        return self._tx(0.0).used_bytes()

    def file_bytes(self) -> int:
        """Bytes on disk: the main file (free pages included) and its -wal."""
        pages = int(self._conn.execute("PRAGMA page_count").fetchone()[0])
        return pages * self._page_size + self._wal_bytes()

    def data_bytes(self) -> int:
        """Bytes that hold data (free pages excluded) and the -wal, counted at its size limit at least (it grows
        back to that between checkpoints): what shedding keeps within the bound, so the file needs no vacuum."""
        return self.used_bytes() + max(self._wal_bytes(), self._wal_limit_bytes)

    def _wal_bytes(self) -> int:
        try:
            return os.stat(f"{self.path}-wal").st_size
        except FileNotFoundError:
            return 0

    def gone(self) -> str | None:
        """Why the store's path no longer names the file this writer has open (deleted, replaced); None if it does."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        return None if (st.st_dev, st.st_ino) == self._identity else "replaced by another file"

    def over_bound(self) -> bool:
        """True when the files on disk hold more than ``retention.max_bytes``."""
        return self.file_bytes() > self.retention.max_bytes

    def compact(self) -> None:
        """Give free pages back to the file system and cut the -wal file back; best effort.

        ``PRAGMA incremental_vacuum`` frees one page per step of its statement. ``execute`` takes one step
        (the pragma's rows have no columns, so even ``fetchall`` stops there); ``executescript`` steps each
        statement to its end. A store made without incremental auto-vacuum is converted by one ``VACUUM``.
        """
        conn = self._conn
        try:
            if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != AUTO_VACUUM_INCREMENTAL:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("VACUUM")
            else:
                # Checkpoint the deletes first: the -wal then holds only the moved pages, not both at once.
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                conn.executescript("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            log.warning("giving free space back after retention failed: %s", exc)

    def checkpoint(self) -> None:
        """Copy the -wal into the main file and cut it back to nothing (waits for readers up to the busy timeout)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def close(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # closing still matters more than the checkpoint
            log.warning("checkpoint on close failed: %s", exc)
        self._conn.close()

    def _tx(self, now_unix_s: float) -> Tx:
        return Tx(self._conn, now_unix_s, self.retention, self._page_size, self._running)

    def _apply(self, ops: Sequence[Op[Any]]) -> list[Any]:
        ops = drop_superseded(ops)
        tx = self._tx(self._clock())
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results = [op.apply(tx) for op in ops]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if any(op.vacuum_after for op in ops):
            self.compact()
        return results


# ---------------------------------------------------------------- background writer


def _is_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: the disk (or the file's page cap) has no room for the transaction."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc)


class _Flush(Op[None]):
    """Queue marker: write what is gathered now (never applied)."""


class _Empty:
    """What ``_get`` returns when the queue stayed empty."""


_FLUSH = _Flush()
_EMPTY = _Empty()
Item = Op[Any] | None  # None: the stop marker


class BackgroundWriter:
    """A ``StoreWriter`` on its own thread, fed by a queue.

    ``submit`` never blocks on disk (safe to call from an asyncio loop). Every
    ``batch_interval_s`` what has been submitted is written in one transaction, or sooner once
    ``max_batch_ops`` operations or a byte share of the bound are gathered. When SQLite fails with
    ``OperationalError`` (disk full, locked), the batch stays in memory and is retried with backoff
    (a full disk: its leading part that fits commits); ``last_error`` and ``pending_count`` say so,
    and the backlog is held within ``max_backlog_records``/``max_backlog_requests`` (oldest samples first).
    Whatever the store does, the records waiting are held within ``max_backlog_bytes``: past it the oldest are
    shed (``shed_count``, ``shed_note``, logged). A store file deleted or replaced under the writer is noticed
    before the next batch and recording goes on in a fresh file at the same path (``reopened_count``, ``reopen_note``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention: RetentionPolicy | None = None,
        batch_interval_s: float = 0.2,
        max_batch_ops: int = MAX_BATCH_OPS,
        max_backlog_records: int = MAX_BACKLOG_RECORDS,
        max_backlog_requests: int = MAX_BACKLOG_REQUESTS,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        busy_timeout_ms: int = 1000,
        max_backoff_s: float = 5.0,
    ) -> None:
        # Opened here, so that an unusable store fails the caller at once.
        self._path = Path(path)
        self._retention = retention
        self._busy_timeout_ms = busy_timeout_ms
        self._writer: StoreWriter | None = StoreWriter(path, retention=retention, busy_timeout_ms=busy_timeout_ms)
        self._batch_interval_s = batch_interval_s
        self._max_batch_ops = max(1, max_batch_ops)
        self._max_backlog_records = max_backlog_records
        self._max_backlog_requests = max_backlog_requests
        self._max_backlog_bytes = max_backlog_bytes
        self._backlog_dropped: dict[str, int] = {}  # operation kind → records dropped for the backlog cap
        self._dropped_note = ""
        # A batch is also cut by size: one transaction of it may not take the store far past its bound.
        self._bound_bytes = self._writer.retention.max_bytes
        self._max_batch_bytes = max(MIN_BATCH_BYTES, min(MAX_BATCH_BYTES, self._bound_bytes // 32))
        self._shed_stuck_at: float | None = None  # when a shed last left the files over the bound (e.g. a reader holds the -wal)
        self._max_backoff_s = max_backoff_s
        self._queue: collections.deque[Item] = collections.deque()
        self._queued_bytes = 0  # held_bytes of the operations in _queue
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._arrived = threading.Condition(self._lock)
        self._gathering = False  # the writer waits out a batch interval (see _get)
        self._submitted = 0
        self._committed = 0
        self._dropped = 0
        self._shed: dict[str, int] = {}  # operation kind → records shed for the backlog's byte cap
        self._shed_logged_at = 0.0
        self._batches = 0
        self._closing = False
        self._give_up_at: float | None = None
        self._wake = threading.Event()
        self._hard_limit: tuple[bool, int | None] = (False, None)
        self.last_error: str | None = None
        self.reopened_count = 0  # times the store file was found deleted or replaced, and a fresh one opened
        self.reopen_note: str | None = None  # what happened the last time (None: never)
        self._on_done: dict[int, Callable[[Any], None]] = {}  # id(op) → called with its result after the commit
        self._thread = threading.Thread(target=self._run, name="phasewatch-store-writer", daemon=True)
        self._thread.start()

    # -- submit: non-blocking

    def submit(self, op: Op[T], on_done: Callable[[T], None] | None = None) -> None:
        """Queue an operation for the next batch; never blocks on disk.

        ``on_done`` is called on the writer's thread with the operation's result once it is committed
        (never for a request upsert that a later one of the same request replaced, nor for a record shed).
        """
        with self._lock:
            if self._closing:
                raise RuntimeError("BackgroundWriter is closed")
            self._submitted += op.weight
            if on_done is not None:
                self._on_done[id(op)] = on_done
            self._queue.append(op)
            self._queued_bytes += op.held_bytes
            shed = self._shed_queue_locked() if self._queued_bytes > self._max_backlog_bytes else {}
            if not self._gathering or self._batch_full_locked():
                # A writer gathering a batch takes what came at the interval's end: waking it for each op would
                # cost both threads a switch per record (the proxy's loop among them), for nothing.
                self._wake_writer_locked()
        if shed:
            self._say_shed(shed)

    def _put(self, item: Item) -> None:
        """A marker (flush, stop) at the queue's end."""
        with self._lock:
            self._queue.append(item)
            self._wake_writer_locked()

    def _wake_writer_locked(self) -> None:
        """With the lock held: the writer takes the queue now, also in the middle of gathering a batch."""
        self._gathering = False
        self._arrived.notify()

    def _batch_full_locked(self) -> bool:
        """With the lock held: the queue alone would fill a batch (by operations or bytes)."""
        return len(self._queue) >= self._max_batch_ops or self._queued_bytes >= self._max_batch_bytes

    def _get(self, timeout_s: float | None) -> Item | _Empty:
        """The queue's oldest item; waits up to ``timeout_s`` (None: for ever, 0: not at all).

        A wait with a timeout is the gathering of a batch: ``submit`` does not wake it for each operation (only
        for a full batch; flush and close always do), and it returns at its timeout with what came meanwhile.
        """
        with self._lock:
            if not self._queue and timeout_s != 0:
                self._gathering = timeout_s is not None
                try:
                    self._arrived.wait_for(lambda: bool(self._queue) and not self._gathering, timeout_s)
                finally:
                    self._gathering = False
            if not self._queue:
                return _EMPTY
            item = self._queue.popleft()
            if item is not None and item is not _FLUSH:
                self._queued_bytes -= item.held_bytes
            return item

    def _shed_queue_locked(self) -> dict[str, int]:
        """With the lock held: shed the queue's oldest records until it holds ``max_backlog_bytes`` at most."""
        kept: collections.deque[Item] = collections.deque()
        shed: dict[str, int] = {}
        while self._queue and self._queued_bytes > self._max_backlog_bytes:
            item = self._queue.popleft()
            if isinstance(item, SHEDDABLE_OPS):
                self._queued_bytes -= item.held_bytes
                self._count_shed_locked(item, shed)
            else:
                kept.append(item)  # markers and upkeep (retention, migrations' re-derives) always stay
        self._queue.extendleft(reversed(kept))
        return shed

    def _count_shed_locked(self, op: Op[Any], shed: dict[str, int]) -> None:
        self._on_done.pop(id(op), None)
        kind = type(op).__name__
        shed[kind] = shed.get(kind, 0) + op.weight
        self._shed[kind] = self._shed.get(kind, 0) + op.weight
        self._dropped += op.weight
        self._done.notify_all()

    def _say_shed(self, shed: dict[str, int]) -> None:
        now = time.monotonic()
        if now - self._shed_logged_at >= SHED_LOG_EVERY_S:
            self._shed_logged_at = now
            log.error("%s (now: %s)", self.shed_note, ", ".join(f"{n} {k}" for k, n in sorted(shed.items())))

    def _forget(self, ops: Sequence[Op[Any]]) -> None:
        """Superseded operations are never applied: their callbacks go."""
        if ops:
            with self._lock:
                for op in ops:
                    self._on_done.pop(id(op), None)

    def _finished(self, ops: Sequence[Op[Any]], results: Sequence[Any]) -> None:
        with self._lock:
            calls = [(self._on_done.pop(id(op)), r) for op, r in zip(ops, results, strict=True) if id(op) in self._on_done]
        for call, result in calls:
            try:
                call(result)
            except Exception:  # a caller's mistake must not stop the writer
                log.exception("on_done callback failed")

    def set_hard_limit_bytes(self, limit_bytes: int | None) -> None:
        """See ``StoreWriter.set_hard_limit_bytes``; applied by the writer thread before its next batch."""
        with self._lock:
            self._hard_limit = (True, limit_bytes)
        self._wake.set()

    # -- state

    @property
    def pending_count(self) -> int:
        """Records submitted and not yet committed (waiting in memory)."""
        with self._lock:
            return self._submitted - self._committed - self._dropped

    @property
    def queued_bytes(self) -> int:
        """Memory held by the records waiting in the queue (``Op.held_bytes``)."""
        with self._lock:
            return self._queued_bytes

    @property
    def committed_batches(self) -> int:
        """Transactions committed so far (each holds one batch)."""
        with self._lock:
            return self._batches

    @property
    def dropped_count(self) -> int:
        """Records not written: refused by SQLite (each logged), or shed for a backlog cap."""
        with self._lock:
            return self._dropped

    @property
    def shed_count(self) -> int:
        """Records shed, the oldest first, because the records waiting passed ``max_backlog_bytes``."""
        with self._lock:
            return sum(self._shed.values())

    @property
    def shed_note(self) -> str | None:
        """What the byte cap shed so far, in words (None: nothing)."""
        with self._lock:
            shed = dict(self._shed)
        if not shed:
            return None
        said = ", ".join(f"{n} {kind}" for kind, n in sorted(shed.items()))
        return (
            f"the store took records slower than they came: over {self._max_backlog_bytes // 2**20} MiB waiting, "
            f"the oldest were shed ({said})"
        )

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything submitted before this call is committed (or shed). False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._submitted
            if self._committed + self._dropped < target:
                self._queue.append(_FLUSH)
                self._wake_writer_locked()
                self._wake.set()
            while self._committed + self._dropped < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._done.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Write everything still queued, then stop. False if the store would not take it within ``timeout_s``."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._give_up_at = time.monotonic() + timeout_s
                self._queue.append(None)
                self._wake_writer_locked()
        self._wake.set()
        self._thread.join(timeout_s + 5.0)
        drained = self.pending_count == 0
        if not drained:
            log.error("store writer closed with %d records not written: %s", self.pending_count, self.last_error)
        return drained

    # -- the thread

    def _run(self) -> None:
        batch: list[Op[Any]] = []
        stop = False
        backoff_s = 0.05
        try:
            while True:
                if not batch and not stop:
                    item = self._get(None)  # idle: block until there is work
                    stop = self._take(item, batch)
                # Gather what arrives within one batch interval; a flush or close ends the wait early, and a full
                # batch (ops or bytes) goes at once, so that little waits in memory for a kill to lose.
                deadline = time.monotonic() + self._batch_interval_s
                hurry = stop or self._wake.is_set()
                size_bytes = sum(op.size_bytes for op in batch)
                while len(batch) < self._max_batch_ops and size_bytes < self._max_batch_bytes:
                    left = 0.0 if hurry else deadline - time.monotonic()
                    item = self._get(max(left, 0.0))
                    if item is _EMPTY:
                        break
                    if item is _FLUSH:
                        hurry = True
                    if self._take(item, batch):
                        stop = hurry = True
                    elif item is not _FLUSH:
                        size_bytes += batch[-1].size_bytes
                self._wake.clear()
                if batch:
                    if self._write(batch):
                        batch = []
                        backoff_s = 0.05
                    else:
                        stop = self._hold_backlog(batch) or stop
                        give_up = self._give_up_at
                        if stop and give_up is not None and time.monotonic() >= give_up:
                            return
                        self._wake.wait(backoff_s)
                        backoff_s = min(backoff_s * 2, self._max_backoff_s)
                        continue
                if stop:
                    return
        finally:
            if self._writer is not None:
                self._writer.close()
            with self._lock:
                self._done.notify_all()

    def _hold_backlog(self, batch: list[Op[Any]]) -> bool:
        """While the store refuses writes: everything queued joins the batch (tried, then split, as one),
        kept within the named caps. Past ``max_backlog_records`` the oldest samples go; requests go only past
        ``max_backlog_requests``; past ``max_backlog_bytes`` the oldest records of any kind. What goes is counted
        as dropped and said in ``last_error``. True for the stop marker.
        """
        stop = False
        while (item := self._get(0)) is not _EMPTY:
            stop = self._take(item, batch) or stop
        dropped: dict[str, int] = {}

        def drop_oldest(kinds: tuple[type[Op[Any]], ...], excess: int, measure: Callable[[Op[Any]], int]) -> None:
            gone: list[Op[Any]] = []
            for op in batch:
                if excess <= 0:
                    break
                if isinstance(op, kinds):
                    gone.append(op)
                    excess -= measure(op)
            gone_ids = {id(op) for op in gone}
            batch[:] = [op for op in batch if id(op) not in gone_ids]
            self._forget(gone)
            for op in gone:
                dropped[type(op).__name__] = dropped.get(type(op).__name__, 0) + op.weight
            with self._lock:
                self._dropped += sum(op.weight for op in gone)
                self._done.notify_all()

        def weight(op: Op[Any]) -> int:
            return op.weight

        drop_oldest(SAMPLE_OPS, sum(op.weight for op in batch) - self._max_backlog_records, weight)
        drop_oldest((PutRequest,), sum(1 for op in batch if isinstance(op, PutRequest)) - self._max_backlog_requests, weight)
        drop_oldest(SHEDDABLE_OPS, sum(op.held_bytes for op in batch) - self._max_backlog_bytes, lambda op: op.held_bytes)
        if dropped:
            for kind, n in dropped.items():
                self._backlog_dropped[kind] = self._backlog_dropped.get(kind, 0) + n
            said = ", ".join(f"{n} {kind}" for kind, n in sorted(self._backlog_dropped.items()))
            self._dropped_note = f"; backlog over its cap, dropped the oldest: {said}"
            self.last_error = f"{self.last_error}{self._dropped_note}"
            log.error("store backlog over its cap: dropped the oldest %s", dict(sorted(dropped.items())))
        return stop

    @staticmethod
    def _take(item: Item | _Empty, batch: list[Op[Any]]) -> bool:
        """Add a queue item to the batch; True for the stop marker."""
        if item is None:
            return True
        if item is not _FLUSH and isinstance(item, Op):
            batch.append(item)
        return False

    def _store(self) -> StoreWriter:
        """The open store, after checking its path still names it: a file deleted or replaced under the collector
        (a cleanup script, a restore) would take every later commit with it. Then: a fresh file, the backlog kept."""
        writer = self._writer
        why = None if writer is None else writer.gone()
        if writer is not None and why is None:
            return writer
        if writer is not None:
            self._writer = None
            self.reopened_count += 1
            self.reopen_note = f"the store file {self._path} was {why} while the collector ran; recording goes on in a fresh file"
            log.error("%s", self.reopen_note)
            writer.close()
            # The -wal and -shm at the path are the old file's (SQLite keeps them when its file was renamed over):
            # a fresh or restored file opened beside them would replay the old pages into itself.
            for suffix in ("-wal", "-shm"):
                Path(f"{self._path}{suffix}").unlink(missing_ok=True)
        # StoreError/sqlite3 errors: the batch waits (retried like a locked store) until the path is usable again.
        self._writer = StoreWriter(self._path, retention=self._retention, busy_timeout_ms=self._busy_timeout_ms)
        with self._lock:  # a cap set on the old file holds for the new one
            self._hard_limit = (self._hard_limit[1] is not None or self._hard_limit[0], self._hard_limit[1])
        return self._writer

    def _write(self, batch: list[Op[Any]]) -> bool:
        """One transaction for the batch. True when it is committed (or its bad records were dropped).

        On a full disk, the batch is split: its leading half (then a quarter, …) is tried alone, so that
        what fits commits; the rest stays in ``batch`` for the retry.
        """
        try:
            store = self._store()
        except (StoreError, OSError, sqlite3.Error) as exc:
            self.last_error = f"the store cannot be opened again: {exc}: {self.pending_count} records waiting"
            log.warning("%s", self.last_error)
            return False
        with self._lock:
            set_limit, limit = self._hard_limit
            self._hard_limit = (False, limit)
        try:
            if set_limit:
                store.set_hard_limit_bytes(limit)
            self._commit(batch)
        except sqlite3.OperationalError as exc:
            # Disk full, locked, I/O: keep the batch, retry later. Progress rows that a later row of the
            # same request replaces need not wait in memory (a long outage would otherwise pile them up).
            kept = drop_superseded(batch)
            superseded = sum(op.weight for op in batch) - sum(op.weight for op in kept)
            batch[:] = kept
            with self._lock:
                self._committed += superseded
            if _is_full(exc):
                self._commit_what_fits(batch)
            with self._lock:
                waiting = self._submitted - self._committed - self._dropped
            if not batch:
                return True
            self.last_error = f"{exc}: {waiting} records waiting{self._dropped_note}"
            log.warning("store write failed, will retry: %s", self.last_error)
            return False
        except Exception as exc:
            # A record SQLite refuses for itself (not for lack of space): write the others one by one.
            log.exception("store batch failed (%s); retrying record by record", exc)
            return self._write_one_by_one(batch)
        return True

    def _commit(self, ops: Sequence[Op[Any]]) -> None:
        """Apply ``ops`` in one transaction and count them as committed; raises what SQLite raises."""
        applied = drop_superseded(ops)
        results = self._store().apply(applied)
        kept_ids = {id(op) for op in applied}  # by identity: == on a request op compares whole records
        self._forget([op for op in ops if id(op) not in kept_ids])
        self.last_error = None  # before the count: a flush that returns sees no stale error
        with self._lock:
            self._committed += sum(op.weight for op in ops)
            self._batches += 1
            self._done.notify_all()
        self._finished(applied, results)
        self._keep_bound(applied)

    def _commit_what_fits(self, batch: list[Op[Any]]) -> None:
        """After SQLITE_FULL on the whole batch: commit its leading part, halved until it fits; the rest stays."""
        n = len(batch) // 2
        while n >= 1 and batch:
            try:
                self._commit(batch[:n])
            except sqlite3.OperationalError as exc:
                if not _is_full(exc):
                    return
                n //= 2
                continue
            del batch[:n]
            n = min(n, len(batch))

    def _keep_bound(self, applied: Sequence[Op[Any]]) -> None:
        """After a commit: over the bound, the full retention pass now (shedding the oldest rows, giving pages
        back); near it, shed the oldest rows to a fraction of it and keep the freed pages for the next rows, so a
        flood at the bound does not vacuum every commit."""
        stuck_at = self._shed_stuck_at
        if any(op.vacuum_after for op in applied) or (stuck_at is not None and time.monotonic() - stuck_at < SHED_MIN_GAP_S):
            return
        store = self._store()
        try:
            if store.over_bound():
                result = store.write(ApplyRetention(time.time()))
                self._shed_stuck_at = time.monotonic() if store.over_bound() else None
            elif store.data_bytes() > int(self._bound_bytes * SHED_AT_FRACTION):
                result = store.write(ShedToBound(time.time()))
            else:
                return
        except sqlite3.Error as exc:  # the next commit checks again
            log.warning("size check failed: %s", exc)
            return
        if result.deleted.get("requests"):
            log.info("store at its size bound: deleted the %d oldest requests", result.deleted["requests"])

    def _write_one_by_one(self, batch: list[Op[Any]]) -> bool:
        for i, op in enumerate(batch):
            try:
                results = self._store().apply([op])
            except sqlite3.OperationalError as exc:
                self.last_error = f"{exc}: records waiting"
                del batch[:i]  # those before i are committed; keep the rest for the retry
                return False
            except Exception as exc:
                log.error("dropped one %s the store refused: %s", type(op).__name__, exc)
                with self._lock:
                    self._dropped += op.weight
                    self._done.notify_all()
                self.last_error = f"dropped one {type(op).__name__}: {exc}"
                continue
            with self._lock:
                self._committed += op.weight
                self._done.notify_all()
            self._finished([op], results)
        return True
