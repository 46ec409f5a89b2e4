"""What the proxy takes from a generation request body (pure: no server needed)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.records import RequestKind
from collectors.proxy.recording import RecordingProxy
from collectors.proxy.request_facts import describe_request


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("endpoint", "fields", "stream"),
    [
        ("/api/generate", {}, True),  # Ollama streams unless told not to
        ("/api/chat", {"stream": None}, True),
        ("/api/generate", {"stream": False}, False),
        ("/v1/chat/completions", {}, False),  # the OpenAI API only when asked
        ("/v1/completions", {"stream": True}, True),
        ("/v1/chat/completions", {"stream": "yes"}, False),
    ],
)
def test_stream_flag_defaults(endpoint: str, fields: dict[str, object], stream: bool) -> None:
    assert describe_request(endpoint, body(model="m", **fields), record_text=False)["stream"] is stream


def test_cost_shaping_options() -> None:
    facts = describe_request(
        "/api/chat",
        body(
            model="llama3.2",
            keep_alive=300,
            messages=[{"role": "user", "content": "hi"}],
            options={"num_ctx": 8192, "num_predict": 64, "temperature": 0.1},
        ),
        record_text=False,
    )
    assert facts == {
        "model": "llama3.2",
        "stream": True,
        "num_ctx": 8192,
        "num_predict": 64,
        "keep_alive": "300",
        "kind": RequestKind.GENERATE,
        "prompt_chars": 2,
    }
    assert describe_request("/api/generate", body(model="m", keep_alive="5m"), record_text=False)["keep_alive"] == "5m"
    assert describe_request("/api/generate", body(model="m", keep_alive=-1), record_text=False)["keep_alive"] == "-1"
    assert describe_request("/v1/completions", body(model="m", max_tokens=12), record_text=False)["num_predict"] == 12
    assert (
        describe_request("/v1/chat/completions", body(model="m", max_completion_tokens=7), record_text=False)["num_predict"] == 7
    )
    # Wrong types are Ollama's to reject; we record nothing for them.
    odd = describe_request("/api/generate", body(model=5, options={"num_ctx": "big", "num_predict": True}), record_text=False)
    assert (odd["model"], odd["num_ctx"], odd["num_predict"]) == ("", None, None)


def test_prompt_text_only_when_asked() -> None:
    chat = body(
        model="m",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    assert "prompt_text" not in describe_request("/api/chat", chat, record_text=False)
    assert describe_request("/v1/chat/completions", chat, record_text=True)["prompt_text"] == "system: be brief\nuser: hi"
    assert describe_request("/api/generate", body(model="m", prompt="why?"), record_text=True)["prompt_text"] == "why?"


@pytest.mark.parametrize("raw", [b"", b"{oops", b"[1,2]", b"\xff\xfe", b"null", b"[" * 50_000])
def test_bad_bodies_give_empty_facts(raw: bytes) -> None:
    facts = describe_request("/api/generate", raw, record_text=True)
    assert facts["model"] == "" or raw == b""
    assert facts["stream"] is True


@settings(max_examples=200, deadline=None)
@given(
    raw=st.binary(max_size=200),
    endpoint=st.sampled_from(["/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions"]),
)
def test_any_body_is_described_without_raising(raw: bytes, endpoint: str) -> None:
    facts = describe_request(endpoint, raw, record_text=True)
    assert isinstance(facts["model"], str) and isinstance(facts["stream"], bool)


def test_upstream_must_be_an_absolute_url() -> None:
    with pytest.raises(ValueError, match="absolute"):
        RecordingProxy("127.0.0.1:11434", lambda _: None)


@pytest.mark.parametrize(
    ("endpoint", "fields", "kind"),
    [
        ("/api/generate", {"prompt": "hi"}, RequestKind.GENERATE),
        ("/api/generate", {}, RequestKind.LOAD),  # an empty prompt only loads the model
        ("/api/generate", {"prompt": "", "keep_alive": 0}, RequestKind.UNLOAD),
        ("/api/chat", {"messages": [], "keep_alive": "0s"}, RequestKind.UNLOAD),
        ("/api/chat", {"keep_alive": "5m"}, RequestKind.LOAD),
        ("/v1/chat/completions", {"messages": []}, RequestKind.GENERATE),  # the OpenAI routes never load alone
        ("/api/embed", {"input": ["a", "b", "c"]}, RequestKind.EMBED),
    ],
)
def test_request_kind(endpoint: str, fields: dict[str, object], kind: RequestKind) -> None:
    assert describe_request(endpoint, body(model="m", **fields), record_text=False)["kind"] is kind
    # Without a model Ollama refuses the request: nothing loads.
    if kind in (RequestKind.LOAD, RequestKind.UNLOAD):
        assert describe_request(endpoint, body(**fields), record_text=False).get("kind") is RequestKind.GENERATE


@pytest.mark.parametrize(
    ("endpoint", "fields", "batch"),
    [
        ("/api/embed", {"input": "one"}, 1),
        ("/api/embed", {"input": ["a", "b", "c"]}, 3),
        ("/api/embeddings", {"prompt": "one"}, 1),
        ("/v1/embeddings", {"input": [1, 2, 3]}, 1),  # one input given as token ids
        ("/v1/embeddings", {"input": [[1, 2], [3]]}, 2),
        ("/api/embed", {}, None),
    ],
)
def test_embed_batch_size_and_no_stream(endpoint: str, fields: dict[str, object], batch: int | None) -> None:
    facts = describe_request(endpoint, body(model="m", **fields), record_text=False)
    assert (facts["batch_size"], facts["stream"]) == (batch, False)


def test_embed_input_is_text_only_when_asked() -> None:
    raw = body(model="m", input=["first", "second"])
    assert "prompt_text" not in describe_request("/api/embed", raw, record_text=False)
    assert describe_request("/api/embed", raw, record_text=True)["prompt_text"] == "first\nsecond"
