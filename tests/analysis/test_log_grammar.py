"""The one grammar of Ollama's log lines (analysis.log_grammar): each form exact from the first character, read the
same by every reader (issue 43 item 1: levels, the slot prefix's function name, the slog line and the caps were
written down four times, each differently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.log_grammar import MAX_LINE_CHARS, go_unquote, runner_line, slog_line, strip_llama_prefix
from analysis.prompt_fit import parse_fit_line
from analysis.runner_load_lines import parse_load_line
from analysis.runner_wait_lines import parse_wait_line
from collectors.ollama.log import parse_line

FIXTURE = Path(__file__).parents[1] / "data" / "real_gpu_h200" / "ollama.log"


def test_every_tagged_line_of_a_real_cuda_run_splits_and_names_its_function() -> None:
    lines = FIXTURE.read_text().splitlines()
    tagged = [x for x in lines if x[:5] in ("slot ", "srv  ", "cmn  ", "spec ", "que  ")]
    assert len(tagged) > 100
    for line in tagged:
        split = runner_line(line)
        assert split is not None, line
        assert line[5:17].lstrip() == split.func
    slots = [runner_line(x) for x in tagged if x.startswith("slot ")]
    assert {(s.slot_id, s.task_id) for s in slots if s is not None} >= {(0, 5), (1, 0), (0, None)}


@pytest.mark.parametrize(
    "line",
    [
        "slot  launch_slot_: id  0 | task 5 | processing task, is_child = 0",  # 13 wide: not the format's 12
        "slot launch_slot: id  0 | task 5 | processing task, is_child = 0",  # 11 wide
        "slot launch slot_: id  0 | task 5 | processing task, is_child = 0",  # a space inside the name
        "slot launch_slot_: id 0 | task 5 | processing task, is_child = 0",  # %2d pads a one-digit id
        "slot launch_slot_: id  0 | task -7 | processing task, is_child = 0",  # -1 is the only negative task
        "slot launch_slot_: id  0 | task 05 | processing task, is_child = 0",
        "x slot launch_slot_: id  0 | task 5 | processing task, is_child = 0",
        "0.09.894.504 slot launch_slot_: id  0 | task 5 | processing task, is_child = 0",  # a time without its level
        "0.09.894.504 T slot launch_slot_: id  0 | task 5 | processing task, is_child = 0",  # no such level letter
    ],
)
def test_a_slot_line_out_of_its_exact_form_is_none(line: str) -> None:
    split = runner_line(line)
    assert split is None or not split.is_slot
    assert parse_line(line, 1.0) is None


def test_the_llama_prefix_is_a_level_letter_with_an_optional_time() -> None:
    body = "slot launch_slot_: id  0 | task 5 | processing task, is_child = 0"
    for prefix in ("", "I ", "W ", "E ", "D ", "0.09.894.504 I ", "12.01.000.001 D "):
        event = parse_line(prefix + body, 1.0)
        assert event is not None and (event.kind, event.task_id) == ("launch", 5), prefix
    assert strip_llama_prefix("T " + body) == "T " + body


def test_load_lines_take_only_the_functions_that_print_them() -> None:
    assert parse_load_line("load_tensors: offloaded 49/49 layers to GPU") is not None
    assert parse_load_line("0.00.090.578 I load_tensors: offloaded 49/49 layers to GPU") is not None
    for forged in [
        "xload_tensors: offloaded 7/19 layers to GPU",
        "grammar: offloaded 7/19 layers to GPU",
        "llama_kv_cache:      CUDA0 model buffer size =  6314.23 MiB",  # a model buffer is load_tensors' line
        "load_tensors:      CUDA0 KV buffer size =  9999.00 MiB",
        "srv  load_tensors: offloaded 7/19 layers to GPU",
        "load_tensors: offloaded 7/19 layers to GPU, really",
    ]:
        assert parse_load_line(forged) is None, forged
        assert parse_line(forged, 1.0) is None, forged


def test_slog_lines_are_whole_with_a_real_time_level_and_source() -> None:
    real = 'time=2026-12-04T18:31:01.404+00:00 level=INFO source=routes.go:1741 msg="server config" env="map[A:1 B:]"'
    slog = slog_line(real)
    assert slog is not None and (slog.level, slog.source, slog.msg, slog.attrs) == (
        "INFO",
        "routes.go:1741",
        "server config",
        {"env": "map[A:1 B:]"},
    )
    assert slog_line(real.replace(".404+00:00", ".404Z")) is not None
    for forged in [
        real.replace("time=2026-12-04T18:31:01.404+00:00", "time=x"),
        real.replace("level=INFO", "level=NOTICE"),
        real.replace("source=routes.go:1741", "source=x"),
        real + " env=x",  # a key twice
        real + ' x="y',  # an unclosed quote
        real + " trailing",
        "x " + real,
        real.replace('env="map[A:1 B:]"', 'env="map[A:1 \\q]"'),  # an escape Go never writes
    ]:
        assert slog_line(forged) is None, forged
        assert parse_fit_line(forged) is None, forged


def test_go_unquote_takes_strconv_quotes_escapes() -> None:
    assert go_unquote(r'"a\"b\\c\n\x41\u00e9"') == 'a"b\\c\nAé'
    assert go_unquote('"a"b"') is None
    assert go_unquote(r'"a\qb"') is None
    assert go_unquote("ab") is None


def test_one_cap_for_every_reader() -> None:
    long = "slot   operator(): id  0 | task 5 | forcing full prompt re-processing due to lack of cache data "
    long += "x" * MAX_LINE_CHARS
    assert parse_wait_line(long) is None and parse_line(long, 1.0) is None
    assert parse_load_line("load_tensors: offloaded 1/2 layers to GPU" + " " * MAX_LINE_CHARS) is None
