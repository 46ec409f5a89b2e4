"""A 400 from Ollama about a capability the model lacks (issue 42: Open WebUI's defaults meet a model without
tools): the request's page says what it means and what to change in the client. The request goes through the
real proxy to sim, which answers as Ollama does (docs/ollama-api.md §5), and is recorded in a real store."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from analysis.error_notes import CAPABILITY_ADVICE, capability_advice
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.proxy_thread import ProxyThread
from tests.support.requests_page import open_request


def _post(url: str, body: dict[str, object]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_thinking_asked_of_a_model_that_cannot_think(proxy: ProxyThread, data_dir: Path) -> None:
    status, body = _post(
        proxy.base_url + "/api/chat",
        {"model": "qwen2.5:0.5b", "messages": [{"role": "user", "content": "hi"}], "think": True, "stream": False},
    )
    assert (status, json.loads(body)) == (400, {"error": '"qwen2.5:0.5b" does not support thinking'})
    (record,) = proxy.wait_records(1)
    writer = StoreWriter(db_path(data_dir))
    try:
        writer.apply([PutRequest(record)])
    finally:
        writer.close()
    at = open_request(record.id)
    assert [i.value for i in at.info if i.value == CAPABILITY_ADVICE["thinking"]], [i.value for i in at.info]


@pytest.mark.parametrize(
    ("error", "capability"),
    [
        ("upstream HTTP 400: llama3.2:latest does not support tools", "tools"),  # Ollama's own wording (§5)
        ('upstream HTTP 400: "nomic-embed-text" does not support generate', "generate"),
        ('upstream HTTP 400: "qwen3:0.6b" does not support thinking', "thinking"),
        ('upstream HTTP 400: "llama3.2" does not support embeddings', "embeddings"),
        (  # what the proxy keeps of Ollama's 400 for images on a model without vision
            'upstream HTTP 400: {"error":{"code":400,"message":"Multimodal data provided, but model does not support '
            'multimodal requests.","type":"invalid_request_error"}}',
            "vision",
        ),
    ],
)
def test_each_capability_has_its_advice(error: str, capability: str) -> None:
    assert capability_advice(400, error) == CAPABILITY_ADVICE[capability]
    assert capability_advice(500, error) is None and capability_advice(400, "upstream HTTP 400: invalid options") is None


def test_images_sent_to_a_model_without_vision(proxy: ProxyThread, data_dir: Path) -> None:
    """Open WebUI with an attached picture and a text model: sim answers as Ollama does (its llama-server's
    refusal passed on whole), the proxy keeps the message, and the request's page says what to change."""
    before = len(proxy.records)  # the module's proxy keeps the other tests' records
    message = {"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}
    status, body = _post(proxy.base_url + "/api/chat", {"model": "llama3.2", "messages": [message], "stream": False})
    assert status == 400, body
    inner = json.loads(json.loads(body)["error"])  # Ollama's error text is llama-server's own JSON body
    assert inner["error"]["message"] == "Multimodal data provided, but model does not support multimodal requests."
    record = proxy.wait_records(before + 1)[-1]
    assert record.status_code == 400 and "does not support multimodal requests" in (record.error or ""), record.error
    writer = StoreWriter(db_path(data_dir))
    try:
        writer.apply([PutRequest(record)])
    finally:
        writer.close()
    at = open_request(record.id)
    assert [i.value for i in at.info if i.value == CAPABILITY_ADVICE["vision"]], [i.value for i in at.info]
