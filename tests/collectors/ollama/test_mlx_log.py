"""The MLX runner's per-request lines (issue 45), in the exact forms its Go source writes them."""

from __future__ import annotations

import pytest

from collectors.ollama.mlx_log import CacheLine, MlxGeneration, MlxRequests, PeakLine, ProgressLine, ServedLine, parse_mlx_line

T = "time=2026-12-07T10:00:00.123+01:00"
CACHE = f'{T} level=INFO source=prefix_cache.go:126 msg="cache hit" total=2048 matched=1500 cached=1500 left=548'
MISS = f'{T} level=INFO source=prefix_cache.go:126 msg="cache miss" total=900 matched=0 cached=0 left=900'
PROGRESS = f'{T} level=INFO source=pipeline.go:204 msg="Prompt processing progress" processed=512 total=548'
LAST = f'{T} level=INFO source=pipeline.go:204 msg="Prompt processing progress" processed=547 total=548'
PEAK = f'{T} level=INFO source=pipeline.go:91 msg="peak memory" size="1.2 GiB"'
SERVED = f"{T} level=INFO source=server.go:225 msg=ServeHTTP method=POST path=/v1/completions took=2.512345s status=200"
STATUS = f"{T} level=INFO source=server.go:225 msg=ServeHTTP method=GET path=/v1/status took=81.2µs status=200"


def test_each_line_in_its_exact_form() -> None:
    assert parse_mlx_line(CACHE) == CacheLine(True, 2048, 1500, 1500, 548)
    assert parse_mlx_line(MISS) == CacheLine(False, 900, 0, 0, 900)
    assert parse_mlx_line(PROGRESS) == ProgressLine(512, 548)
    assert parse_mlx_line(PEAK) == PeakLine()
    assert parse_mlx_line(SERVED) == ServedLine("POST", "/v1/completions", 2.512345, 200)


@pytest.mark.parametrize(
    "line",
    [
        "[GIN] echoed " + CACHE,  # a fragment inside another line
        CACHE + " extra=1",
        CACHE.replace("left=548", "left=549"),  # cached + left != total
        CACHE.replace("cache hit", "cache miss"),  # a miss with cached tokens
        PROGRESS.replace("processed=512", "processed=600"),  # more than were left
        CACHE.replace("level=INFO", "level=DEBUG"),
        SERVED.replace("took=2.512345s", "took=soon"),
        f'{T} level=INFO source=x.go:1 msg="cache hit total=5 matched=1 cached=1 left=4"',  # inside the message
    ],
)
def test_anything_else_is_no_line(line: str) -> None:
    assert parse_mlx_line(line) is None


def _feed(reqs: MlxRequests, *lines: str) -> list[MlxGeneration]:
    out: list[MlxGeneration] = []
    for text in lines:
        parsed = parse_mlx_line(text)
        assert parsed is not None, text
        if (done := reqs.feed(parsed)) is not None:
            out.append(done)
    return out


def test_a_request_is_told_from_its_lines() -> None:
    reqs = MlxRequests()
    assert _feed(reqs, CACHE, PROGRESS) == []
    assert reqs.current is not None and reqs.current.reading and reqs.current.read_tokens == 1500 + 512
    (gen,) = _feed(reqs, LAST, PEAK, STATUS, SERVED)
    assert (gen.prompt_tokens, gen.cached_tokens, gen.read_tokens, gen.took_s, gen.status) == (
        2048,
        1500,
        2047,
        pytest.approx(2.512345),
        200,
    )
    assert gen.output_tokens is None  # in none of its lines: unknown, never 0
    assert reqs.current is None and reqs.out_of_order == 0


def test_lines_out_of_order_are_counted_not_joined() -> None:
    reqs = MlxRequests()
    assert _feed(reqs, PROGRESS, SERVED) == []  # no request open
    assert _feed(reqs, MISS, PROGRESS) == []  # progress of another request's size
    assert reqs.out_of_order == 3
