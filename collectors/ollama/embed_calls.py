"""Embedding calls sent to Ollama directly: the runner tasks of one ``/api/embed`` (or ``/api/embeddings``,
``/v1/embeddings``) call, gathered into one embedding record.

Ollama sends each input of an embed call to its runner as its own request: a runner task that reads its prompt and
is released at once (llama-server prints ``new prompt … task.n_tokens = N`` then ``release … n_tokens = N``, and no
timing line), so one upload of a few hundred chunks is a few hundred tasks. ``DirectTasks`` hands this module each
task whose own lines and /slots say so (``input_tokens``); the tasks are then gathered by Ollama's access line of the
call they ran within (``could_be_in``), and written as one ``RequestKind.EMBED`` record: its inputs, the sum of
their prompt tokens, the call's route, status and time from the line.

Believed only as far as the runner confirms it: a line alone (anyone who can reach Ollama's API can have text
printed into its log) makes no record; it only gathers tasks /slots showed (``collectors.ollama.direct``). An input
within two calls' lines, or within none once the wait is over, is recorded alone as an embedding with its tokens and
no route: never as a generation, never in a call it may not be of. A task a finished proxied embed call covers is
the proxy's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from analysis.records import FinalMetrics, Outcome, RequestKind, RequestRecord, SeenFrom
from collectors.ollama.access_fit import ACCESS_SLACK_S, ANSWER_LAG_S, READ_SLACK_S
from collectors.ollama.log import AccessLine, EventKind, LogEvent

MAX_CALL_LINES = 1024  # embed access lines kept to gather inputs (a flood keeps the latest)
# An input waits this long after its end for the access line of its call: Ollama writes the line when the whole call
# ends, and a call of a few hundred chunks on a CPU runner lasts minutes.
CALL_LINE_WAIT_S = 600.0
MAX_WAITING_INPUTS = 65_536  # inputs waiting for their call's line; past it the oldest are recorded alone
TIMING_KINDS = frozenset({EventKind.PROMPT_EVAL, EventKind.EVAL, EventKind.TOTAL, EventKind.PROGRESS, EventKind.DONE})


@dataclass(frozen=True)
class EmbedInput:
    """One input of an embed call: a runner task confirmed to have read its prompt and been released at once."""

    record_id: str  # the direct record id its task would have had
    port: int
    pid: int
    task_id: int
    model: str
    start_lo: float  # its start lies between these (polls around it)
    start_hi: float
    end_lo: float  # its end lies between these
    end_hi: float
    prompt_tokens: int
    load_s: float | None


def input_tokens(lines: Iterable[LogEvent], *, decoded: bool, final_ctx: int | None) -> int | None:
    """The prompt size of a task that is an embedding input, by its own lines and /slots, else None: exactly one
    ``new prompt`` and one ``release`` line of the same size (released right after its prompt), no timing line,
    and /slots never saw it decode nor a context after it of another size."""
    prompts: list[int] = []
    releases: list[int] = []
    for event in lines:
        if event.kind in TIMING_KINDS:
            return None  # a generation's lines (or a forger's: either way not confirmed as an embedding)
        if event.kind == EventKind.NEW_PROMPT:
            prompts.append(event.tokens)
        elif event.kind == EventKind.RELEASE:
            releases.append(event.tokens)
    if decoded or len(prompts) != 1 or releases != prompts:
        return None
    if final_ctx is not None and final_ctx != prompts[0]:
        return None
    return prompts[0]


def could_be_in(inp: EmbedInput, line: AccessLine) -> bool:
    """Whether the input's task may have run within the call of ``line``: it began no earlier than the call and
    ended no later (the line is stamped to the second; the runner's release may follow the call's answer by up to
    ``ANSWER_LAG_S``). A line read before the input could have ended is not its call's: Ollama writes it once the
    call's last input is answered (a call just after another, its first input seen only between two polls, was
    otherwise the earlier call's)."""
    call_end_hi = line.ended_unix_s + 1 + ACCESS_SLACK_S
    if line.read_unix_s is not None:
        call_end_hi = min(call_end_hi, line.read_unix_s + ANSWER_LAG_S + READ_SLACK_S)
    call_start_lo = line.ended_unix_s - line.latency_s - ACCESS_SLACK_S
    return inp.end_lo <= call_end_hi and inp.start_hi >= call_start_lo


def _proxied_covers(rec: RequestRecord, end: float, inp: EmbedInput) -> bool:
    return rec.kind is RequestKind.EMBED and rec.started_at_unix_s - ACCESS_SLACK_S <= inp.start_hi and inp.end_lo <= end + 1


@dataclass
class _Call:
    line: AccessLine
    inputs: list[EmbedInput] = field(default_factory=list)


class EmbedCalls:
    """Embed inputs → one record per call (module doc). ``DirectTasks`` feeds it and drains its records."""

    def __init__(self, *, wait_s: float = CALL_LINE_WAIT_S) -> None:
        self.wait_s = wait_s
        self._lines: deque[AccessLine] = deque(maxlen=MAX_CALL_LINES)
        self._calls: dict[int, _Call] = {}  # id(line) → the inputs gathered for it
        self._waiting: deque[EmbedInput] = deque()
        self.recorded_calls = 0  # embedding records of a whole call
        self.recorded_alone = 0  # inputs recorded alone (no call's line, or two)
        self.proxied_inputs = 0  # inputs a proxied embed call covers

    def line(self, access: AccessLine) -> None:
        self._lines.append(access)

    def add(self, inp: EmbedInput) -> None:
        if len(self._waiting) >= MAX_WAITING_INPUTS:
            self._waiting.popleft()  # the oldest: decided at the next step as alone
        self._waiting.append(inp)

    def step(
        self,
        now: float,
        *,
        proxied: Iterable[tuple[float, RequestRecord]],
        line_expected: bool,
        settle_s: float,
        to_mono: Callable[[float], int],
    ) -> list[RequestRecord]:
        """Inputs gathered into their call or recorded alone; a call is written ``settle_s`` after its line's second
        (its last input is handed over once its own wait for log lines and the proxy is over)."""
        finished = [(end, rec) for end, rec in proxied if rec.kind is RequestKind.EMBED]
        out: list[RequestRecord] = []
        still: deque[EmbedInput] = deque()
        for inp in self._waiting:
            if any(_proxied_covers(rec, end, inp) for end, rec in finished):
                self.proxied_inputs += 1
                continue
            lines = [a for a in self._lines if could_be_in(inp, a)]
            if len(lines) == 1:
                self._calls.setdefault(id(lines[0]), _Call(lines[0])).inputs.append(inp)
            elif len(lines) > 1 or not line_expected or now - inp.end_hi > self.wait_s:
                out.append(_record([inp], None, to_mono))
                self.recorded_alone += 1
            else:
                still.append(inp)
        self._waiting = still
        for key, call in list(self._calls.items()):
            if now < call.line.ended_unix_s + 1 + ACCESS_SLACK_S + settle_s:
                continue
            del self._calls[key]
            if call.line in self._lines:
                self._lines.remove(call.line)
            # A proxied call whose request finished after its first inputs were gathered: the proxy's, all of it.
            if any(_proxied_covers(rec, end, inp) for end, rec in finished for inp in call.inputs):
                self.proxied_inputs += len(call.inputs)
                continue
            out.append(_record(call.inputs, call.line, to_mono))
            self.recorded_calls += 1
        return out


def _record(inputs: list[EmbedInput], line: AccessLine | None, to_mono: Callable[[float], int]) -> RequestRecord:
    """One embedding record: the call's span from its line (else the inputs' own), their tokens summed."""
    first = min(inputs, key=lambda i: (i.start_lo, i.task_id))
    last = max(inputs, key=lambda i: (i.end_hi, i.task_id))
    load_s = first.load_s
    # The call ends as its last input is released (Ollama answers at once); with its line, it began the line's
    # latency before that, else when its first input began (its load before it).
    end = (last.end_lo + last.end_hi) / 2
    start = end - line.latency_s if line is not None else (first.start_lo + first.start_hi) / 2 - (load_s or 0.0)
    total_ns = round(line.latency_s * 1e9) if line is not None else None
    metrics = FinalMetrics(
        load_duration_ns=round(load_s * 1e9) if load_s is not None else None,
        prompt_eval_count=sum(i.prompt_tokens for i in inputs),
        total_duration_ns=total_ns,
    )
    received_ns = to_mono(start)
    outcome = Outcome.OK if line is None or line.status < 400 else Outcome.HTTP_ERROR
    return RequestRecord(
        id=f"{first.record_id}-embed",
        started_at_unix_s=start,
        client_addr=line.client if line is not None else None,
        client_unverified=line is not None,
        endpoint=line.path if line is not None else None,
        model=first.model,
        stream=False,
        kind=RequestKind.EMBED,
        batch_size=len(inputs) if line is not None else None,
        received_ns=received_ns,
        forwarded_ns=received_ns,
        final_chunk_ns=to_mono(end),
        status_code=line.status if line is not None else None,
        outcome=outcome,
        metrics=metrics,
        thinking_chunks=None,
        seen_from=SeenFrom.RUNNER,
        runner_port=first.port,
        runner_task_id=first.task_id,
        runner_source="log",
        ends_bound_s=(last.end_hi - last.end_lo) / 2,
    )
