"""What Ollama does with a prompt longer than the context, and the start lines that say which context it uses.

* A prompt longer than ``num_ctx`` - 1 tokens is cut as Ollama's runner cuts it (``analysis.prompt_fit.truncate``:
  ``num_keep`` + BOS from the start, then the end, about half the context left free) and Ollama logs::

      time=… level=WARN source=llama_server.go:314 msg="truncating input prompt" limit=1027 prompt=6000 keep=5 new=1027

  the reply's ``prompt_eval_count`` is then the cut length.
* A model whose runner cannot shift its context (``python -m sim --no-context-shift``, or a request's
  ``"shift": false``) is answered 400 with Ollama's text instead.
* At start, Ollama's ``server config``, ``inference compute`` (one per GPU) and ``vram-based default context``
  lines, with the settings sim runs with (docs/ollama-api.md §12).
"""

from __future__ import annotations

from collections.abc import Mapping

from analysis.prompt_fit import TOO_LONG_MESSAGE, truncate
from sim import ollama_log
from sim.backend import EngineError

GIB = 1024**3


def fit_prompt(ids: list[int], num_ctx: int, *, can_shift: bool = True, num_keep: int = 4) -> list[int]:
    """The prompt Ollama sends its runner: ``ids`` when it fits, else cut (and logged), or a 400 when it cannot shift."""
    kept, line = truncate(ids, num_ctx, num_keep)
    if line is None:
        return ids
    if not can_shift:
        raise EngineError(400, TOO_LONG_MESSAGE)
    ollama_log.slog(
        "truncating input prompt",
        source="llama_server.go:314",
        level="WARN",
        limit=line.limit,
        prompt=line.prompt,
        keep=line.keep,
        new=line.new,
    )
    return kept


def _go_map(env: Mapping[str, str]) -> str:
    """Go's fmt of a map[string]any (keys sorted), as Ollama prints its server config."""
    return "map[" + " ".join(f"{k}:{v}" for k, v in sorted(env.items())) + "]"


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def vram_default_num_ctx(total_vram_bytes: float) -> int:
    """Ollama's default context by total VRAM (docs/ollama-api.md §7)."""
    if total_vram_bytes >= 47 * GIB:
        return 262144
    if total_vram_bytes >= 23 * GIB:
        return 32768
    return 4096


def log_start_lines(
    env: Mapping[str, str], *, gpu_name: str | None, total_vram_bytes: float, available_vram_bytes: float, library: str = "CUDA"
) -> None:
    """Ollama's start lines: its settings, each GPU it found (or the CPU), and the default context from VRAM."""
    ollama_log.slog("server config", source="routes.go:1741", env=_go_map(env))
    if gpu_name is None:
        attrs: dict[str, str] = {"id": "cpu", "library": "cpu", "compute": "", "name": "cpu", "description": "cpu"}
    else:
        attrs = {"id": "GPU-00000000-0000-0000-0000-000000000000", "library": library, "compute": "8.9", "name": f"{library}0"}
        attrs["description"] = gpu_name
    attrs |= {"total": _gib(total_vram_bytes), "available": _gib(available_vram_bytes)}
    ollama_log.slog("inference compute", source="types.go:42", **attrs)
    vram = total_vram_bytes if gpu_name is not None else 0
    ollama_log.slog(
        "vram-based default context", source="routes.go:1914", total_vram=_gib(vram), default_num_ctx=vram_default_num_ctx(vram)
    )
