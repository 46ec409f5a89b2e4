"""A small aiohttp client for the Lab's probes, timing every chunk as it arrives.

The official ``ollama`` client parses each chunk into pydantic objects and
drops keys it does not know (``prompt_eval_cached_count``); the Lab needs the
raw final chunk and the arrival time of every line, and it must be able to
close a stream at once when cancelled (closing the connection is what makes
Ollama free the slot). So it reads the NDJSON itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from collectors.config import SettingsError, client_auth_headers, ollama_base_url

USER_AGENT = "phasewatch-lab/0.1"


class LabError(Exception):
    """A failure the user can act on; the message says what and where."""


class OllamaUnreachable(LabError):
    pass


class UnknownModel(LabError):
    pass


class ProbeError(LabError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def normalize_url(url: str) -> str:
    """An ``OLLAMA_HOST``-style value → the URL to connect to, by Ollama's own rules (``collectors.config``)."""
    try:
        return ollama_base_url(url)
    except SettingsError as exc:
        raise LabError(str(exc)) from None


@dataclass
class Probe:
    """What one generation looked like from the client's side (monotonic ns) plus Ollama's final chunk."""

    sent_ns: int
    first_byte_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)  # every chunk that carried text
    done_ns: int | None = None
    final: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def first_token_ns(self) -> int | None:
        return self.token_ns[0] if self.token_ns else None

    @property
    def ttft_s(self) -> float | None:
        t = self.first_token_ns
        return None if t is None else (t - self.sent_ns) / 1e9

    def metric_s(self, key: str) -> float | None:
        v = self.final.get(key)
        return None if v is None else v / 1e9

    @property
    def prompt_tokens(self) -> int | None:
        return self.final.get("prompt_eval_count")

    @property
    def cached_tokens(self) -> int | None:
        return self.final.get("prompt_eval_cached_count")

    @property
    def eval_count(self) -> int | None:
        return self.final.get("eval_count")

    @property
    def prefill_s(self) -> float | None:
        return self.metric_s("prompt_eval_duration")

    @property
    def load_s(self) -> float:
        return self.metric_s("load_duration") or 0.0

    @property
    def prefill_tok_s(self) -> float | None:
        """Cache-aware: only the tokens actually evaluated, over the time they took."""
        n, d = self.prompt_tokens, self.prefill_s
        if n is None or not d:
            return None
        return (n - (self.cached_tokens or 0)) / d

    @property
    def decode_tok_s(self) -> float | None:
        """``eval_count`` includes the first token and ``eval_duration`` spans first→last: n−1 intervals."""
        n, d = self.eval_count, self.metric_s("eval_duration")
        if n is None or n < 2 or not d:
            return None
        return (n - 1) / d

    @property
    def queue_s(self) -> float | None:
        """What ``total_duration`` holds beyond load, prefill and decode: slot wait and templating."""
        total = self.metric_s("total_duration")
        if total is None:
            return None
        return max(0.0, total - self.load_s - (self.prefill_s or 0.0) - (self.metric_s("eval_duration") or 0.0))

    def gaps_ms(self) -> list[float]:
        return [(b - a) / 1e6 for a, b in zip(self.token_ns, self.token_ns[1:], strict=False)]


class LabClient:
    """One aiohttp session to one Ollama (or the recording proxy in front of it, with its PHASEWATCH_TOKEN)."""

    def __init__(self, base_url: str, *, connect_timeout_s: float = 10.0) -> None:
        self.base_url = normalize_url(base_url)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
            headers={"User-Agent": USER_AGENT, **client_auth_headers()},  # the collector's token, when set
            connector=aiohttp.TCPConnector(limit=0),  # the concurrency experiment opens many streams
        )

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> LabClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.base_url + path
        try:
            async with self._session.request(method, url, json=body) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise ProbeError(f"{method} {url}: {resp.status} {_error_text(raw)}", resp.status)
                return json.loads(raw)
        except aiohttp.ClientConnectionError as exc:
            raise OllamaUnreachable(f"cannot reach Ollama at {self.base_url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ProbeError(f"{method} {url}: answer is not JSON ({exc})") from exc

    async def version(self) -> str:
        data = await self._json("GET", "/api/version")
        return str(data.get("version", "?"))

    async def tags(self) -> list[dict[str, Any]]:
        return list((await self._json("GET", "/api/tags")).get("models") or [])

    async def ps(self) -> list[dict[str, Any]]:
        return list((await self._json("GET", "/api/ps")).get("models") or [])

    async def show(self, model: str) -> dict[str, Any]:
        try:
            return dict(await self._json("POST", "/api/show", {"model": model}))
        except ProbeError as exc:
            if exc.status == 404:
                raise UnknownModel(f"model {model!r} not found at {self.base_url}") from exc
            raise

    async def unload(self, model: str) -> None:
        await self._json("POST", "/api/generate", {"model": model, "keep_alive": 0})

    async def stream(
        self,
        path: str,
        body: dict[str, Any],
        *,
        probe: Probe | None = None,
        on_token: Callable[[Probe], None] | None = None,
    ) -> Probe:
        """POST a streaming generate/chat and time every line. Cancelling closes the connection at once.

        Pass ``probe`` to keep what was measured even if the call is cancelled; ``on_token`` runs
        after each chunk that carried text.
        """
        body = {**body, "stream": True}
        url = self.base_url + path
        if probe is None:
            probe = Probe(sent_ns=0)
        probe.sent_ns = time.monotonic_ns()
        resp: aiohttp.ClientResponse | None = None
        try:
            resp = await self._session.post(url, json=body)
            probe.first_byte_ns = time.monotonic_ns()
            if resp.status >= 400:
                raw = await resp.read()
                msg = _error_text(raw)
                if resp.status == 404:
                    raise UnknownModel(f"model {body.get('model')!r} not found at {self.base_url}: {msg}")
                raise ProbeError(f"POST {url}: {resp.status} {msg}", resp.status)
            parts: list[str] = []
            async for line in resp.content:
                now = time.monotonic_ns()
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if "error" in chunk:
                    raise ProbeError(f"POST {url}: stream failed: {chunk['error']}")
                text = _chunk_text(chunk)
                if text:
                    probe.token_ns.append(now)
                    parts.append(text)
                    if on_token is not None:
                        on_token(probe)
                if chunk.get("done"):
                    probe.done_ns = now
                    probe.final = chunk
                    break
            probe.text = "".join(parts)
            if probe.done_ns is None:
                raise ProbeError(f"POST {url}: stream ended without a final chunk")
            return probe
        except aiohttp.ClientConnectionError as exc:
            raise OllamaUnreachable(f"cannot reach Ollama at {self.base_url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ProbeError(f"POST {url}: malformed line in the stream ({exc})") from exc
        finally:
            if resp is not None:
                # close(), not release(): an unfinished stream must drop the connection so the server frees the slot.
                if probe.done_ns is None:
                    resp.close()
                else:
                    resp.release()


def _chunk_text(chunk: dict[str, Any]) -> str:
    if "response" in chunk:
        return str(chunk.get("response") or "") + str(chunk.get("thinking") or "")
    msg = chunk.get("message") or {}
    return str(msg.get("content") or "") + str(msg.get("thinking") or "")


def _error_text(raw: bytes) -> str:
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return raw[:200].decode("utf-8", "replace")
