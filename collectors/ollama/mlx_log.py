"""The lines Ollama's MLX runner writes per request (Apple Silicon's engine for safetensors models), read from
Ollama's log, where the server copies its runner's output.

The runner (``ollama runner --mlx-engine --model NAME --port N``) has no ``/slots``; it serves one request at a
time and says, through Go's slog text handler with its source (x/mlxrunner: prefix_cache.go, pipeline.go,
server.go)::

    time=… level=INFO source=prefix_cache.go:126 msg="cache hit" total=2048 matched=1500 cached=1500 left=548
    time=… level=INFO source=pipeline.go:204 msg="Prompt processing progress" processed=512 total=548
    time=… level=INFO source=pipeline.go:91 msg="peak memory" size="1.2 GiB"
    time=… level=INFO source=server.go:225 msg=ServeHTTP method=POST path=/v1/completions took=2.5s status=200

``total`` of the cache line is the prompt's tokens, ``cached`` those taken from the cache, ``left`` those to read
(``total - cached``); a progress line's ``total`` is that ``left``, its ``processed`` how many of them are read
(the last one is read by the first decode step, so it stops one short). ``took`` is the whole request, from its
arrival at the runner to its last byte. The output's token count is in none of them: it stays unknown.

Each line counts only in its exact form, whole, with its numbers consistent with each other (``cached + left ==
total``, ``processed <= total``); nothing here stacks wildcards. Which runner wrote a line is not in it: the reader
of a log must join these lines to a runner only where exactly one MLX runner is running.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analysis.log_grammar import slog_line
from collectors.ollama.go_duration import go_duration_s

MAX_TOKENS = 10**9  # a count past this is no real prompt's
# Each message's attributes, in the order the runner prints them; any other set or order is not its line.
_ATTRS = {
    "cache hit": ("total", "matched", "cached", "left"),
    "cache miss": ("total", "matched", "cached", "left"),
    "Prompt processing progress": ("processed", "total"),
    "peak memory": ("size",),
    "ServeHTTP": ("method", "path", "took", "status"),
}
_COUNT = re.compile(r"[0-9]{1,10}")
_SIZE = re.compile(r"[0-9.]{1,16} ?[KMGTP]?i?B")
_METHOD = re.compile(r"[A-Z]{3,7}")
_PATH = re.compile(r"/[\w/]{1,64}")
_STATUS = re.compile(r"[0-9]{3}")


@dataclass(frozen=True)
class CacheLine:
    hit: bool
    prompt_tokens: int
    matched_tokens: int
    cached_tokens: int
    left_tokens: int


@dataclass(frozen=True)
class ProgressLine:
    processed_tokens: int  # of the tokens left to read after the cache
    left_tokens: int


@dataclass(frozen=True)
class PeakLine:
    pass


@dataclass(frozen=True)
class ServedLine:
    method: str
    path: str
    took_s: float
    status: int


MlxLine = CacheLine | ProgressLine | PeakLine | ServedLine


def _counts(attrs: dict[str, str], keys: tuple[str, ...]) -> list[int] | None:
    values = [attrs[k] for k in keys]
    return [int(v) for v in values] if all(_COUNT.fullmatch(v) for v in values) else None


def _cache(hit: bool, attrs: dict[str, str]) -> CacheLine | None:
    nums = _counts(attrs, _ATTRS["cache hit"])
    if nums is None:
        return None
    total, matched, cached, left = nums
    if total > MAX_TOKENS or cached + left != total or matched > total or (not hit) != (cached == 0):
        return None
    return CacheLine(hit, total, matched, cached, left)


def _progress(attrs: dict[str, str]) -> ProgressLine | None:
    nums = _counts(attrs, _ATTRS["Prompt processing progress"])
    if nums is None:
        return None
    processed, left = nums
    return ProgressLine(processed, left) if 0 < processed <= left <= MAX_TOKENS else None


def _served(attrs: dict[str, str]) -> ServedLine | None:
    method, path, took, status = (attrs[k] for k in _ATTRS["ServeHTTP"])
    if not (_METHOD.fullmatch(method) and _PATH.fullmatch(path) and _STATUS.fullmatch(status)):
        return None
    took_s = go_duration_s(took)
    return ServedLine(method, path, took_s, int(status)) if took_s is not None else None


def parse_mlx_line(text: str) -> MlxLine | None:
    """The MLX runner's line ``text`` means, or None when it is none of them in its exact form (Ollama's slog line
    as ``analysis.log_grammar`` reads it, its message one of the four, with exactly that message's attributes)."""
    slog = slog_line(text)
    if slog is None or tuple(slog.attrs) != _ATTRS.get(slog.msg):
        return None
    if slog.msg == "ServeHTTP":
        return _served(slog.attrs)
    if slog.level != "INFO":
        return None
    if slog.msg.startswith("cache "):
        return _cache(slog.msg == "cache hit", slog.attrs)
    if slog.msg == "peak memory":
        return PeakLine() if _SIZE.fullmatch(slog.attrs["size"]) else None
    return _progress(slog.attrs)


@dataclass
class MlxGeneration:
    """One request to the MLX runner as its lines tell it. ``output_tokens`` is never in them: None (unknown)."""

    prompt_tokens: int
    cached_tokens: int
    read_tokens: int = 0  # of the prompt, read so far (the cached ones included)
    took_s: float | None = None  # the whole request at the runner, once it ended
    status: int | None = None
    output_tokens: int | None = None

    @property
    def reading(self) -> bool:
        return self.took_s is None and self.read_tokens < self.prompt_tokens - 1


class MlxRequests:
    """The MLX runner's lines in the order read, turned into generations. The runner serves one at a time, so one
    is open at most (a bound of one, by its design): a cache line opens it, progress lines advance it, the
    ServeHTTP line of ``/v1/completions`` ends it. A line out of that order is counted in ``out_of_order``."""

    def __init__(self) -> None:
        self.current: MlxGeneration | None = None
        self.out_of_order = 0

    def feed(self, line: MlxLine) -> MlxGeneration | None:
        """The generation that ``line`` ends, else None."""
        if isinstance(line, CacheLine):
            self.out_of_order += self.current is not None  # one never ended: its lines were lost
            self.current = MlxGeneration(line.prompt_tokens, line.cached_tokens, read_tokens=line.cached_tokens)
            return None
        gen = self.current
        if isinstance(line, ProgressLine):
            if gen is None or line.left_tokens != gen.prompt_tokens - gen.cached_tokens:
                self.out_of_order += 1
                return None
            gen.read_tokens = gen.cached_tokens + line.processed_tokens
            return None
        if isinstance(line, ServedLine) and line.method == "POST" and line.path == "/v1/completions":
            if gen is None:
                self.out_of_order += 1
                return None
            gen.took_s, gen.status, self.current = line.took_s, line.status, None
            return gen
        return None
