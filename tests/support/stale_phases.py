"""How many stored requests still wait for the collector to split them again (tests of the re-derivation)."""

from __future__ import annotations

import sqlite3

from store.tables import PHASES_VERSION


def stale_phases_count(conn: sqlite3.Connection) -> int:
    """Finished requests whose phases came from an older split (the collector re-derives them)."""
    (n,) = conn.execute(
        "SELECT COUNT(*) FROM requests WHERE phases_version < ? AND outcome <> 'in_flight'", (PHASES_VERSION,)
    ).fetchone()
    return int(n)
