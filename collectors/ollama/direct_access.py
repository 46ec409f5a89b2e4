"""Which generation an Ollama access line is (``collectors.ollama.direct``): each task, proxied request and task
decided without a line as a ``Claimant``, and the lines handed out where only one generation can own each."""

from __future__ import annotations

from analysis.records import RequestRecord
from collectors.ollama.access_fit import ANSWER_LAG_S, Claimant
from collectors.ollama.direct_record import Figures
from collectors.ollama.direct_task import Task


def claimant(task: Task, figures: Figures) -> Claimant:
    """The task as an access line's possible owner: its span (its load included), and whether the runner ran it
    to its end (it decoded and its runner did not go away: Ollama answered it, so a 5xx line is not its)."""
    start = figures.start - (task.load_s or 0.0)
    end = figures.end if figures.end is not None else figures.start
    lo, hi = task.end if task.end is not None else (end, end)
    return Claimant(start, max(end, hi), answered=figures.decode_start is not None and not task.gone, earliest_end=lo)


def span(task: Task) -> Claimant:
    """A rival task as an access line's possible owner: as late a start and as wide an end as its polls allow."""
    lo, hi = task.end if task.end is not None else (task.first_seen_unix_s, task.first_seen_unix_s)
    return Claimant(late_start(task), hi, earliest_end=lo)


def late_start(task: Task) -> float:
    """A rival's start, as late as its polls allow: it fits every line it may own."""
    return task.start[1] if task.start is not None else task.first_seen_unix_s


def proxied(rec: RequestRecord, end: float) -> Claimant:
    """A finished proxied request as an access line's possible owner: its last chunk reached the proxy at ``end``,
    a moment after Ollama wrote it and about when its handler returned (the line's end)."""
    return Claimant(rec.started_at_unix_s, end, status=rec.status_code, earliest_end=end - ANSWER_LAG_S)


def assign(candidates: list[set[int]]) -> dict[int, int]:
    """Generation → line, where it follows: a generation left with one line takes it, unless another is left
    with that same line alone (then neither does); repeated until nothing more follows."""
    assigned: dict[int, int] = {}
    while True:
        taken = set(assigned.values())
        wanted: dict[int, list[int]] = {}  # line → the generations it is the only line left for
        for k, cands in enumerate(candidates):
            left = cands - taken
            if k not in assigned and len(left) == 1:
                wanted.setdefault(next(iter(left)), []).append(k)
        alone = {line: ks[0] for line, ks in wanted.items() if len(ks) == 1}
        if not alone:
            return assigned
        for line, k in alone.items():
            assigned[k] = line
