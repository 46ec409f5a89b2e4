"""Direct requests Ollama answered with an error and no runner task of which was seen: recorded from its access line.

A chat sent straight to Ollama that fails before a runner takes it (a load that failed, a runner that could not be
reached, a bad request) leaves only Ollama's access line: ``[GIN] … | 500 | 1.234s | 127.0.0.1 | POST "/api/chat"``.
``collectors.ollama.direct`` hands such a line here once no generation can own it (no runner task fits it, no
proxied request with that status ended then); the record keeps what the line says (route, client, status, how long
the request took, when it ended to the second) and nothing it does not (the model: unknown, never guessed).

The line is Ollama's text, not a socket this collector saw, and anyone who can make a runner print a line can
forge one: the client is marked unverified, and at most ``MAX_FAILED_PER_MIN`` such records are written a minute
(the rest counted, never written).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable

from analysis.phases import PhaseSource
from analysis.records import Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.log import AccessLine

# After the second an error line ended in: time for every generation that may own it to be decided (a task's
# wait for the proxy and its log lines, ``direct.GRACE_S`` + ``direct.LOG_WAIT_S``, with a margin).
FAILED_WAIT_S = 10.0
MAX_FAILED_PER_MIN = 60  # failed direct requests recorded from access lines alone, per minute at most
LINE_STAMP_BOUND_S = 0.5  # the line's stamp is the whole second it ended in: its middle, give or take this


def is_failure(line: AccessLine) -> bool:
    return line.status >= 400


class FailureBudget:
    """At most ``per_min`` records in any minute (a flood of forged lines writes no more)."""

    def __init__(self, per_min: int = MAX_FAILED_PER_MIN) -> None:
        self.per_min = per_min
        self._times: deque[float] = deque(maxlen=per_min)

    def allow(self, now: float) -> bool:
        if len(self._times) == self.per_min and self._times[0] > now - 60.0:
            return False
        self._times.append(now)
        return True


def failed_record(line: AccessLine, now_wall_s: float, to_mono: Callable[[float, float], int]) -> RequestRecord:
    """The failed request as the line tells it: ended in the middle of its second, began its latency before (its
    span, received to closed, is the latency: ``analysis.phases`` gives it as the total). No figures of a runner."""
    end = line.ended_unix_s + LINE_STAMP_BOUND_S
    start = end - line.latency_s
    received_ns = to_mono(start, now_wall_s)
    return RequestRecord(
        id=f"direct-failed-{int(line.ended_unix_s)}-{uuid.uuid4().hex[:12]}",
        started_at_unix_s=start,
        client_addr=line.client,
        client_unverified=True,
        endpoint=line.path,
        model="",  # the line names none
        stream=None,
        kind=RequestKind.GENERATE,
        received_ns=received_ns,
        forwarded_ns=received_ns,
        closed_ns=to_mono(end, now_wall_s),
        status_code=line.status,
        outcome=Outcome.CANCELLED if line.status == 499 else Outcome.HTTP_ERROR,
        seen_from=SeenFrom.RUNNER,
        runner_source=PhaseSource.ACCESS,
        ends_bound_s=LINE_STAMP_BOUND_S,
    )
