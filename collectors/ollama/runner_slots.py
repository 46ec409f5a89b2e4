"""Reading a runner's ``/slots`` (llama-server): asking for it without following redirects or reading past
``MAX_BODY_BYTES``, and what its answer says (``classify_slots_answer``); ``read_once`` reads every runner once, for
``python -m collectors.ollama``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp

from analysis.records import LoadedModel
from collectors.ollama.discovery import DigestCache, Runner, discover
from collectors.ollama.runner_state import RunnerState, model_of
from collectors.ollama.slots import MAX_SLOTS, SlotReading, SlotsFormatError, parse_slots, slots_cap

SLOTS_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 4 << 20  # /slots carries prompt text; a larger body is not read


def classify_slots_answer(status: int, body: bytes, max_slots: int = MAX_SLOTS) -> tuple[list[SlotReading] | None, str | None]:
    """(readings, None) for a usable /slots answer of at most ``max_slots`` slots, else (None, why not).
    A redirect is an answer like any other status: never followed (whatever answers on a runner's port
    could send the collector anywhere)."""
    if status != 200:
        hint = {404: " (no /slots: an older runner?)", 501: " (started with --no-slots)"}.get(status, "")
        return None, f"/slots answered HTTP {status}{hint}"
    # Each slot has one "is_processing" key, and a quote inside a JSON string is escaped: counting them bounds
    # the slots before a parse (parse_slots counts again, exactly), so a list of thousands costs no parse.
    if body.count(b'"is_processing"') > max_slots:
        return None, f"/slots answered something that is not a list of slots: more than the runner's {max_slots} slots"
    try:
        return parse_slots(json.loads(body), max_slots), None
    except (ValueError, SlotsFormatError) as exc:
        return None, f"/slots answered something that is not a list of slots: {str(exc)[:120]}"
    except RecursionError:  # nested deeper than the parser goes: not llama-server's answer
        return None, "/slots answered something that is not a list of slots: JSON nested too deeply"


async def fetch_slots(session: aiohttp.ClientSession, runner: Runner) -> tuple[list[SlotReading] | None, str | None]:
    """One /slots reading of a llama-server runner: (readings, None), or (None, why not)."""
    timeout = aiohttp.ClientTimeout(total=SLOTS_TIMEOUT_S)
    try:
        async with session.get(runner.base_url + "/slots", timeout=timeout, allow_redirects=False) as resp:
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_BODY_BYTES:  # the prompt text makes it long; beyond this, not worth reading
                    return None, f"/slots answered more than {MAX_BODY_BYTES} bytes"
            return classify_slots_answer(resp.status, bytes(body), slots_cap(runner.n_parallel))
    except TimeoutError:
        return None, f"/slots did not answer within {SLOTS_TIMEOUT_S:g} s"
    except aiohttp.ClientConnectorError as exc:
        return None, f"cannot connect to the runner on port {runner.port}: {exc.os_error.strerror or exc}"
    except (aiohttp.ClientError, OSError) as exc:
        return None, f"/slots failed: {type(exc).__name__}: {exc}"


# -- python -m collectors.ollama ------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect comes back as its own status (see ``classify_slots_answer``), never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())  # loopback: never via a proxy
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY_BYTES + 1)


def read_once(ollama_url: str) -> dict[str, Any]:
    """Discover the runners, match their models through /api/ps and read each one's /slots once."""
    from collectors.ollama.poller import PollError, parse_ps

    found = discover(ollama_url)
    models: list[LoadedModel] = []
    ps_problem = None
    try:
        status, body = _get(ollama_url.rstrip("/") + "/api/ps", 5.0)
        models = parse_ps(json.loads(body), time.time()) if status == 200 else []
        if status != 200:
            ps_problem = f"/api/ps answered HTTP {status}"
    except (OSError, ValueError, RecursionError, PollError) as exc:
        ps_problem = f"/api/ps: {type(exc).__name__}: {str(exc)[:120]}"
    digests = DigestCache()
    out = []
    for runner in found.runners:
        digest = digests.digest(runner.model_path) if runner.model_path else None
        state = RunnerState(runner, digest=digest, model=model_of(digest, models))
        try:
            status, body = _get(runner.base_url + "/slots", SLOTS_TIMEOUT_S)
            readings, state.problem = classify_slots_answer(status, body, slots_cap(runner.n_parallel))
            if len(body) > MAX_BODY_BYTES:
                readings, state.problem = None, f"/slots answered more than {MAX_BODY_BYTES} bytes"
            state.slots = readings or []
        except OSError as exc:
            state.problem = f"cannot read /slots: {exc}"
        out.append(state.as_json())
    return {"ollama": ollama_url, "found_by": found.found_by, "problem": found.problem, "ps_problem": ps_problem, "runners": out}
