"""Generations on Ollama's MLX runner, recorded from Ollama's log: one direct record each, exactly once.

The MLX runner (``ollama runner --mlx-engine``) has no ``/slots``, so its requests are known only from its lines in
Ollama's log (``collectors.ollama.mlx_log``). Those lines do not say which runner wrote them, so they are believed
only while exactly one MLX runner is running and answers its ``/v1/status`` (the caller confirms that, through
discovery and that answer); lines read at any other moment are dropped, counted, never guessed onto a runner.

What a record holds, and how sure it is:

* prompt and cached tokens: exact (the ``cache hit|miss`` line);
* the request's whole time at the runner: exact (``took=`` of its ``ServeHTTP`` line); its end is when that line was
  read, so start and end are each within one log read (``ends_bound_s``) of the truth;
* output tokens: unknown (None): no MLX line carries them. A proxied request gets them from Ollama's final reply;
  a direct one has no such channel, and unknown is never stored as zero;
* prefill and decode times: unknown (None): the lines give no split of ``took``.

While a prompt is being read, ``progress`` gives Live its reading from the ``Prompt processing progress`` lines.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from analysis.model_names import same_model
from analysis.records import (
    FinalMetrics,
    Outcome,
    ProgressSample,
    ProgressSource,
    RequestKind,
    RequestRecord,
    SeenFrom,
)
from collectors.ollama.discovery import MLX_RUNNER, Runner
from collectors.ollama.mlx_log import MlxGeneration, MlxLine, MlxRequests, parse_mlx_line

MAX_FINISHED_PROXIED = 256  # finished proxied requests kept to tell the proxy's generations from direct ones...
FINISHED_PROXIED_KEPT_S = 120.0  # ...for this long at most (a log read comes within seconds of a request's end)
END_SLACK_S = 2.0  # a proxied request's end and its runner line's reading: how far apart they may be and still fit
RUNNER_SOURCE = "log"  # RequestRecord.runner_source: the figures are the runner's own lines in Ollama's log


class MlxDirect:
    """Ollama's log lines plus the MLX runner's presence, turned into direct records.

    Bounded by the runner's design: it serves one request at a time, so at most one generation is open
    (``MlxRequests``); nothing here grows with the log."""

    def __init__(
        self,
        read_tick_s: float,
        clock: Callable[[], float] = time.time,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.read_tick_s = read_tick_s  # how often the log is read: the bound on when a line was written
        self._clock, self._mono_ns = clock, mono_ns
        self._runner: Runner | None = None
        self._requests = MlxRequests()
        self._open_id: str | None = None
        self._opened: tuple[float, int] = (0.0, 0)  # when the open generation's cache line was read (wall s, mono ns)
        self._seq = 0  # generations recorded on this runner: each record's id is new, so none is written twice
        self.dropped = 0  # MLX lines read while not exactly one MLX runner was confirmed
        self._proxied = False  # a proxied request of the runner's model was in flight while the open one ran
        self.proxied = 0  # generations left to the proxy's records
        self._finished: deque[tuple[float, str, int | None]] = deque(maxlen=MAX_FINISHED_PROXIED)  # (end, model, prompt)

    @property
    def runner(self) -> Runner | None:
        """The one MLX runner whose lines are believed now, if any."""
        return self._runner

    def runners_seen(self, confirmed: Iterable[Runner]) -> None:
        """The runners found now whose ``/v1/status`` answered: lines are believed only when one is an MLX runner."""
        mlx = [r for r in confirmed if r.kind == MLX_RUNNER]
        runner = mlx[0] if len(mlx) == 1 else None
        if runner != self._runner:  # another runner (or none): what was open on the old one is not its
            self._requests, self._open_id = MlxRequests(), None
        self._runner = runner

    def proxied_finished(self, rec: RequestRecord) -> None:
        """A proxied request ended: a generation of its model and prompt size ending about now is its, not direct."""
        prompt = rec.metrics.prompt_eval_count if rec.metrics is not None else None
        self._finished.append((self._clock(), rec.model, prompt))

    def _proxy_finished_it(self, gen: MlxGeneration) -> bool:
        now, model = self._clock(), (self._runner.model_path if self._runner else None) or ""
        while self._finished and now - self._finished[0][0] > FINISHED_PROXIED_KEPT_S:
            self._finished.popleft()
        for i, (end, name, prompt) in enumerate(self._finished):
            fits = abs(now - end) <= END_SLACK_S + (gen.took_s or 0.0) and prompt in (None, gen.prompt_tokens)
            if fits and same_model(name, model):
                del self._finished[i]  # it accounts for one generation only
                return True
        return False

    def lines(self, texts: Iterable[str], proxied_models: Iterable[str] = ()) -> list[RequestRecord]:
        """Feed lines of Ollama's log as read; the generations they end, as final records."""
        return self.feed((m for t in texts if (m := parse_mlx_line(t)) is not None), proxied_models)

    def feed(self, lines: Iterable[MlxLine], proxied_models: Iterable[str] = ()) -> list[RequestRecord]:
        """Feed the MLX runner's parsed lines, in order; ``proxied_models``: the models of the proxied requests in
        flight now. A generation during which one of its model was in flight is the proxy's (the proxy records it
        from Ollama's own reply, output tokens included): never recorded here too, only counted (``proxied``)."""
        done: list[RequestRecord] = []
        busy_models = list(proxied_models)
        for line in lines:
            if self._runner is None:
                self.dropped += 1
                continue
            opened = self._requests.current
            gen = self._requests.feed(line)
            if self._requests.current is not None and self._requests.current is not opened:
                self._seq += 1
                self._opened = (self._clock(), self._mono_ns())
                # With when it opened (ms): a restarted collector, counting from 1 again, never reuses a stored id.
                opened_ms = round(self._opened[0] * 1000)
                self._open_id = f"runner-mlx-{self._runner.port}-{self._runner.pid}-{opened_ms}-{self._seq}"
                self._proxied = False
            model = self._runner.model_path or ""
            self._proxied = self._proxied or any(same_model(m, model) for m in busy_models)
            if gen is not None and self._open_id is not None:
                if self._proxied or self._proxy_finished_it(gen):
                    self.proxied += 1
                else:
                    done.append(self._record(gen, self._open_id))
                self._open_id = None
        return done

    def progress(self) -> ProgressSample | None:
        """The open generation's prompt read so far, while it is being read (else None)."""
        gen = self._requests.current
        if gen is None or self._open_id is None or self._proxied or not gen.reading:
            return None
        return ProgressSample(
            request_id=self._open_id,
            ts_unix_s=self._clock(),
            source=ProgressSource.LOG,
            processed_tokens=gen.read_tokens - gen.cached_tokens,
            prompt_tokens=gen.prompt_tokens,
            cached_tokens=gen.cached_tokens,
        )

    def in_flight(self) -> RequestRecord | None:
        """The open generation as an in-flight record (for Live), else None."""
        gen = self._requests.current
        if gen is None or self._open_id is None or self._proxied:
            return None
        return self._record(gen, self._open_id)

    def _record(self, gen: MlxGeneration, rid: str) -> RequestRecord:
        assert self._runner is not None
        now, mono = self._clock(), self._mono_ns()
        final = gen.took_s is not None
        took_s = gen.took_s or 0.0
        metrics = None
        if final:
            metrics = FinalMetrics(
                total_duration_ns=round(took_s * 1e9),
                prompt_eval_count=gen.prompt_tokens,
                prompt_eval_cached_count=gen.cached_tokens,
                eval_count=gen.output_tokens,  # None: no MLX line says it
            )
        status = gen.status
        outcome = Outcome.IN_FLIGHT
        if final:
            outcome = Outcome.OK if status is not None and status < 400 else Outcome.HTTP_ERROR
        # Final: its start is took= before the line that ends it; open: when its cache line was read.
        started_s, received_ns = (now - took_s, mono - round(took_s * 1e9)) if final else self._opened
        return RequestRecord(
            id=rid,
            started_at_unix_s=started_s,
            client_addr=None,
            endpoint=None,
            model=self._runner.model_path or "",
            stream=None,
            kind=RequestKind.GENERATE,
            received_ns=received_ns,
            forwarded_ns=received_ns,
            final_chunk_ns=mono if final else None,
            status_code=status,
            outcome=outcome,
            metrics=metrics,
            thinking_chunks=None,
            seen_from=SeenFrom.RUNNER,
            runner_port=self._runner.port,
            runner_source=RUNNER_SOURCE,
            ends_bound_s=self.read_tick_s,
        )
