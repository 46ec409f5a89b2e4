"""The ``error`` notes of failed exchanges: kinds only with text recording off, as received with it on."""

from __future__ import annotations

from analysis.error_notes import ERROR_MESSAGE_CHARS, http_error_note, malformed_note

REPLY = "the secret reply text"


def test_http_error_keeps_status_and_server_message_without_text() -> None:
    assert http_error_note(404, b'{"error":"model \'x\' not found"}', keep_text=False) == "upstream HTTP 404: model 'x' not found"
    openai = b'{"error":{"message":"bad request","type":"invalid_request_error"}}'
    assert http_error_note(400, openai, keep_text=False) == "upstream HTTP 400: bad request"
    # Any other body (HTML from a reverse proxy, an echo of the request, a cut JSON) is not kept.
    for body in (f"<html>{REPLY}</html>".encode(), f'{{"response":"{REPLY}"}}'.encode(), f'{{"error":"{REPLY}'.encode(), b""):
        assert http_error_note(502, body, keep_text=False) == "upstream HTTP 502"
    long = http_error_note(500, b'{"error":"' + b"x" * 5000 + b'"}', keep_text=False)
    assert len(long) == len("upstream HTTP 500: ") + ERROR_MESSAGE_CHARS and long.endswith("…")


def test_http_error_body_is_kept_with_text_recording_on() -> None:
    body = f"<html>{REPLY}</html>".encode()
    assert http_error_note(502, body, keep_text=True) == body.decode()


def test_malformed_chunks_keep_the_kind_not_the_excerpt() -> None:
    problems = [f'not JSON (JSONDecodeError): b\'{{"response":"{REPLY}\'', "eval_count is not a non-negative integer: 'x'"]
    note = malformed_note(3, problems, keep_text=False)
    kinds = "not JSON (JSONDecodeError); eval_count is not a non-negative integer"
    assert note == f"3 malformed upstream chunk(s), passed on untouched: {kinds}"
    assert REPLY in malformed_note(3, problems, keep_text=True)
