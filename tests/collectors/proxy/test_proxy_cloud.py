"""A cloud model's chat through the proxy (issue 41: "cloud models recorded as cloud"), in front of sim playing one as
Ollama serves it (``--cloud-model``, docs/ollama-api.md §15), driven by the official ``ollama`` client, streamed and
not: recorded once, as the model the client asked for (the reply names the remote model), flagged cloud, its tokens
the reply's counts, the client's time to first token and every gap (held to when sim wrote them, with the proxy's hop
as margin), and no phase of this machine (load, queue, prefill unknown, never 0)."""

from __future__ import annotations

from typing import Any

import ollama
import openai
import pytest

from analysis.phases import Flag, PhaseSource
from tests.support.proxy_process import ProxyChild
from tests.support.record_checks import call_recorded, no_zero_for_unknown, span_s
from tests.support.sim_process import SimProcess

CLOUD = "gpt-oss:120b-cloud"
NUM_PREDICT = 24  # 24 chunks 12.5 ms apart: gaps far above the proxy's timing noise
HOP_MARGIN_S = 0.15  # the proxy's hop to sim and back, on a busy two-core machine

pytestmark = pytest.mark.sim_args("--disk-gbs", "60", "--cloud-model", CLOUD)


@pytest.fixture(scope="module")
def proxy(proxy_child: ProxyChild) -> ProxyChild:
    """The proxy in its own process: these tests hold its stamps to sim's truth (tests/conftest.py, proxy_child)."""
    return proxy_child


def client_saw(measured_s: float | None, sim_before_s: float, sim_after_s: float) -> bool:
    """A span the proxy timed against sim's: the proxy received the request before sim did and read the chunk after
    sim made it (``sim_before_s``, sim's stamp before its write), so it is never shorter than that; and it is longer
    than ``sim_after_s`` (sim's stamp after its write) by at most the hop both ways (a loaded machine's margin).
    sim's stamp after its write is no lower bound: sim may be paused between its write and that stamp while the
    proxy already reads the chunk (seen: 2.4 ms on a loaded machine)."""
    return measured_s is not None and sim_before_s <= measured_s <= sim_after_s + HOP_MARGIN_S


def _client(proxy: ProxyChild) -> ollama.Client:
    return ollama.Client(host=proxy.base_url, timeout=60)


def test_streamed_cloud_chat_keeps_the_clients_times_and_the_replys_counts(sim: SimProcess, proxy: ProxyChild) -> None:
    messages = [{"role": "user", "content": "tell me about clouds"}]
    rec, ph, t = call_recorded(
        sim, proxy, lambda: _client(proxy).chat(CLOUD, messages=messages, stream=True, options={"num_predict": NUM_PREDICT})
    )
    assert t["kind"] == "cloud" and rec.model == CLOUD  # the client's name, not the reply's "gpt-oss:120b"
    assert (rec.endpoint, rec.stream, rec.outcome, rec.seen_from) == ("/api/chat", True, "ok", "proxy")
    assert Flag.CLOUD in ph.flags
    written = t["token_written_ns"]
    assert len(rec.token_chunk_ns) == len(written) == NUM_PREDICT
    assert client_saw(ph.ttft_s, span_s(t["received_ns"], t["token_sampled_ns"][0]), span_s(t["received_ns"], written[0]))
    # Every gap as the client saw it: the proxy's stamp of each chunk (a 12.5 ms gap within 5% would be 0.6 ms, below
    # a busy machine's scheduling noise: the whole decode is held to sim's, and each gap is there, never negative).
    assert ph.decode_source == PhaseSource.STREAM and ph.decode_s is not None
    assert abs(ph.decode_s - span_s(written[0], written[-1])) <= HOP_MARGIN_S  # first to last chunk, as written
    gaps = [b - a for a, b in zip(rec.token_chunk_ns, rec.token_chunk_ns[1:], strict=False)]
    assert len(gaps) == NUM_PREDICT - 1 and all(g >= 0 for g in gaps)  # 0: two chunks came in one read (a busy machine)
    assert (ph.prompt_tokens, ph.output_tokens) == (t["reported"]["prompt_eval_count"], t["reported"]["eval_count"])
    assert ph.output_tokens == NUM_PREDICT and ph.prompt_tokens == t["prompt_tokens"] > 0
    assert ph.load_s is None and ph.queue_s is None and ph.prefill_s is None  # nothing of it ran here
    no_zero_for_unknown(ph)


def test_whole_cloud_chat_has_no_client_ttft_and_no_local_phase(sim: SimProcess, proxy: ProxyChild) -> None:
    messages = [{"role": "user", "content": "and again, whole"}]
    rec, ph, t = call_recorded(
        sim, proxy, lambda: _client(proxy).chat(CLOUD, messages=messages, stream=False, options={"num_predict": 5})
    )
    assert (rec.model, rec.stream, rec.outcome) == (CLOUD, False, "ok") and Flag.CLOUD in ph.flags
    assert rec.token_chunk_ns == [] and ph.ttft_s is None  # one body: no token before the whole reply
    assert (ph.prompt_tokens, ph.output_tokens) == (t["reported"]["prompt_eval_count"], 5)
    assert client_saw(ph.client_s, span_s(t["received_ns"], t["token_sampled_ns"][-1]), span_s(t["received_ns"], t["done_ns"]))
    assert ph.load_s is None and ph.queue_s is None and ph.prefill_s is None and ph.server_ttft_s is None
    no_zero_for_unknown(ph)


def test_openai_chat_to_a_cloud_model_is_recorded_as_cloud(sim: SimProcess, proxy: ProxyChild) -> None:
    client = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="ollama", timeout=60, max_retries=0)
    messages: Any = [{"role": "user", "content": "through the OpenAI route"}]

    def call() -> Any:
        return client.chat.completions.create(
            model=CLOUD, messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )

    rec, ph, t = call_recorded(sim, proxy, call)
    assert (rec.model, rec.endpoint, rec.stream, rec.outcome) == (CLOUD, "/v1/chat/completions", True, "ok")
    assert t["kind"] == "cloud" and Flag.CLOUD in ph.flags
    first_s = (span_s(t["received_ns"], t["token_sampled_ns"][0]), span_s(t["received_ns"], t["token_written_ns"][0]))
    assert client_saw(ph.ttft_s, *first_s)
    assert (ph.prompt_tokens, ph.output_tokens) == (t["reported"]["prompt_eval_count"], 8)
    assert ph.output_tokens_source == PhaseSource.USAGE
    assert ph.load_s is None and ph.queue_s is None and ph.prefill_s is None
    no_zero_for_unknown(ph)
