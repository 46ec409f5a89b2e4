"""Wait for a condition instead of sleeping a fixed time: a test is as quick as the machine lets it be,
and a busy machine gets the whole timeout before the test fails.

    info = wait_until(lambda: read_lock(data), 30, "the collector's lock")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    check: Callable[[], object],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    interval_s: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """``check()``'s first truthy result, polled every ``interval_s``; AssertionError naming ``what`` after
    ``timeout_s``. Exceptions of the ``ignoring`` types count as "not yet" (a page still loading). The result
    is ``Any``: a check such as ``lock is not None and lock.listen and lock`` narrows only at run time."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = result = check()
            if result:
                return result
        except ignoring as e:
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)


async def wait_until_async(check: Callable[..., object], timeout_s: float = 30.0, what: str = "the condition") -> Any:
    """``wait_until`` for a test running in an event loop: sleeps with ``asyncio.sleep``, so the loop runs on."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)
    return result
