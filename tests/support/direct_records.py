"""Direct records (requests sent to Ollama directly, recorded from its runner and its log) built by hand, for the
Requests page's tests: a success the runner's log timed with its access line fitted, and a failure recorded from an
access line alone (``collectors.ollama.access_failures``), both as the collector writes them."""

from __future__ import annotations

from analysis.records import FinalMetrics, Outcome, RequestRecord, SeenFrom
from collectors.ollama.access_failures import failed_record
from collectors.ollama.log import AccessLine

NS = 1_000_000_000
SUCCESS_ID = "direct-39511-4242-50-1900000000"


def to_mono(wall_s: float, now_wall_s: float) -> int:
    """The collector's monotonic clock: 10^12 ns at ``now_wall_s``."""
    return 10**12 - round((now_wall_s - wall_s) * NS)


def direct_success(t0: float) -> RequestRecord:
    """A direct task the runner's log timed, begun at ``t0``: 0.78 s of prefill, 1 s of decode; its access line
    fitted (200, 29.104 s: it waited ~27 s for the slot before)."""
    start_ns = to_mono(t0, t0 + 40)
    return RequestRecord(
        id=SUCCESS_ID,
        started_at_unix_s=t0,
        client_addr="10.0.0.5",
        client_unverified=True,
        endpoint="/api/chat",
        model="gemma3:270m",
        stream=None,
        received_ns=start_ns,
        forwarded_ns=start_ns,
        first_token_ns=start_ns + 780_000_000,
        final_chunk_ns=start_ns + 1_780_000_000,
        status_code=200,
        outcome=Outcome.OK,
        metrics=FinalMetrics(
            total_duration_ns=29_104_000_000,
            prompt_eval_count=40,
            prompt_eval_cached_count=0,
            prompt_eval_duration_ns=780_000_000,
            eval_count=8,
            eval_duration_ns=1_000_000_000,
        ),
        seen_from=SeenFrom.RUNNER,
        runner_port=39511,
        runner_task_id=50,
        runner_source="log",
    )


def direct_failure(t0: float) -> RequestRecord:
    """A direct chat Ollama answered 500 after 28.2 s, ending in the same second as ``direct_success(t0)``."""
    line = AccessLine(ended_unix_s=t0 + 1, status=500, latency_s=28.2, client="10.0.0.6", method="POST", path="/api/chat")
    return failed_record(line, t0 + 45, to_mono)


EMBED_INPUTS = 40


def direct_embed(t0: float) -> RequestRecord:
    """A direct /api/embed call of ``EMBED_INPUTS`` inputs begun at ``t0`` (0.1 s each, 7 + i % 5 tokens), gathered
    by ``collectors.ollama.embed_calls`` from its inputs' runner tasks and its access line (200, 4.05 s)."""
    from collectors.ollama.embed_calls import EmbedCalls, EmbedInput

    calls = EmbedCalls()
    for i in range(EMBED_INPUTS):
        a, b = t0 + 0.1 * i, t0 + 0.1 * (i + 1)
        calls.add(
            EmbedInput(
                f"direct-39513-4343-{100 + 2 * i}-{int(a)}",
                39513,
                4343,
                100 + 2 * i,
                "embedgemma:270m",
                a,
                a,
                b,
                b,
                7 + i % 5,
                None,
            )
        )
    calls.line(
        AccessLine(
            ended_unix_s=float(int(t0 + 4.0)), status=200, latency_s=4.05, client="10.0.0.7", method="POST", path="/api/embed"
        )
    )
    (rec,) = calls.step(t0 + 30, proxied=[], line_expected=True, settle_s=0.0, to_mono=lambda w: to_mono(w, t0 + 30))
    return rec
