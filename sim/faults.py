"""One-shot fault switches for tests, set with ``POST /sim/faults``.

Each switch applies once, to the next generation (or, for ``fail_next_load``,
the next model load), then clears itself:

* ``fail_next_load``: "text" -- the next load fails: HTTP 500 ``{"error": text}``.
* ``cut_after_tokens``: N -- after N content chunks the connection is closed, no final chunk.
* ``malformed_after_tokens``: N -- after N content chunks a broken JSON line is sent and the stream ends.
* ``cut_inside_token_after_tokens``: N -- after N content chunks the next one is sent only in part (its
  text included, its JSON unfinished) and the connection is closed, like a runner dying mid-write.
* ``error_after_tokens``: N -- after N content chunks a final ``{"error": ...}`` line is sent (status stays 200).
* ``raise_after_tokens``: N -- after N content tokens the engine raises an unexpected exception (a backend
  bug, ``sim.engine`` only): the stream ends as after a crashed runner, with a final ``{"error": ...}`` line
  (or a 500 when N is 0), on every route.
* ``stall_ms``: N -- the batch step that produces the request's token number
  ``stall_after_tokens`` (default 1, the first token) takes N ms longer, like a driver hiccup;
  everything in that batch is delayed and reported durations include it.
"""

from __future__ import annotations

from typing import Any

GENERATION_KEYS = (
    "cut_after_tokens",
    "cut_inside_token_after_tokens",
    "malformed_after_tokens",
    "error_after_tokens",
    "raise_after_tokens",
    "stall_ms",
    "stall_after_tokens",
)
ALL_KEYS = ("fail_next_load", *GENERATION_KEYS)


class FaultError(ValueError):
    pass


class Faults:
    def __init__(self) -> None:
        self._pending: dict[str, Any] = {}

    def set(self, body: object) -> None:
        """Merge switches from a JSON object; unknown keys or wrong types are rejected whole."""
        if not isinstance(body, dict):
            raise FaultError("faults must be a JSON object")
        for key, value in body.items():
            if key not in ALL_KEYS:
                raise FaultError(f"unknown fault {key!r}; known: {', '.join(ALL_KEYS)}")
            if key == "fail_next_load":
                if not isinstance(value, str) or not value:
                    raise FaultError("fail_next_load must be a non-empty string")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FaultError(f"{key} must be a non-negative integer")
        self._pending.update(body)

    def snapshot(self) -> dict[str, Any]:
        return dict(self._pending)

    def clear(self) -> None:
        self._pending.clear()

    def take_generation(self) -> dict[str, Any]:
        """The generation switches, removed so they apply only once."""
        taken = {k: self._pending.pop(k) for k in GENERATION_KEYS if k in self._pending}
        if "stall_after_tokens" in taken and "stall_ms" not in taken:
            self._pending["stall_after_tokens"] = taken.pop("stall_after_tokens")
        return taken

    def take_load_failure(self) -> str | None:
        value = self._pending.pop("fail_next_load", None)
        return str(value) if value is not None else None
