"""The kinds of log line ``parse_line`` understands are one vocabulary (``EventKind``): its values never change (the
readers and their tests compare them), every table keyed by them covers exactly the members, and each member is what
a real line of its kind parses to."""

from __future__ import annotations

from collectors.ollama.direct import TASK_LINE_KINDS
from collectors.ollama.embed_calls import TIMING_KINDS
from collectors.ollama.log import EVENT_KINDS, EventKind, parse_line
from collectors.ollama.runner_log import RUNNER_TASK_KINDS

RELEASED = {
    "progress",
    "done",
    "prompt_eval",
    "eval",
    "total",
    "launch",
    "new_prompt",
    "release",
    "access",
    "runner_start",
    "runner_listening",
    "runner_started",
    "runner_load",
    "prompt_fit",
    "runner_wait",
    "mlx",
}
_SLOG = "time=2026-12-04T18:31:01.404+00:00 level=INFO source="
# One line of each kind, as the runner and Ollama print them (docs/ollama-api.md §13).
SAMPLES: dict[EventKind, str] = {
    EventKind.PROGRESS: "slot update_slots: id  0 | task 3 | prompt processing, n_tokens = 512, progress = 0.42",
    EventKind.DONE: "slot update_slots: id  0 | task 3 | prompt processing done, n_tokens = 512",
    EventKind.PROMPT_EVAL: "slot print_timing: id  0 | task 3 | prompt eval time =      35.65 ms /    20 tokens",
    EventKind.EVAL: "slot print_timing: id  0 | task 3 |        eval time =     142.16 ms /     4 tokens",
    EventKind.TOTAL: "slot print_timing: id  0 | task 3 |       total time =     177.81 ms /    24 tokens",
    EventKind.LAUNCH: "slot launch_slot_: id  0 | task 3 | processing task, is_child = 0",
    EventKind.NEW_PROMPT: "slot   operator(): id  0 | task 3 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 20",
    EventKind.RELEASE: "slot      release: id  0 | task 3 | stop processing: n_tokens = 24, truncated = 0",
    EventKind.ACCESS: '[GIN] 2026/06/12 - 22:48:16 | 200 |       1.2ms |       127.0.0.1 | POST     "/api/generate"',
    EventKind.RUNNER_START: _SLOG
    + 'llama_server.go:431 msg="starting llama-server" cmd="/usr/bin/llama-server --model /m.gguf --port 41234"',
    EventKind.RUNNER_LISTENING: "main: server is listening on http://127.0.0.1:41234 - starting the main loop",
    EventKind.RUNNER_STARTED: _SLOG + 'llama_server.go:1200 msg="llama runner started in 2.51 seconds"',
    EventKind.RUNNER_LOAD: "load_tensors: offloaded 19/19 layers to GPU",
    EventKind.PROMPT_FIT: 'time=2026-06-12T22:48:14.120Z level=WARN source=llama_server.go:314 msg="truncating input prompt" '
    "limit=1 prompt=2 keep=1 new=1",
    EventKind.RUNNER_WAIT: "srv  get_availabl: prompt cache update took 1.08 ms",
    EventKind.MLX: _SLOG + 'pipeline.go:204 msg="Prompt processing progress" processed=512 total=548',
}


def test_the_values_are_the_released_ones() -> None:
    assert {k.value for k in EventKind} == RELEASED


def test_every_kind_has_its_meaning_and_nothing_else_does() -> None:
    assert set(EVENT_KINDS) == set(EventKind)
    assert all(isinstance(k, EventKind) and v.strip() for k, v in EVENT_KINDS.items())


def test_a_real_line_of_each_kind_parses_to_that_kind() -> None:
    assert set(SAMPLES) == set(EventKind)
    for kind, line in SAMPLES.items():
        event = parse_line(line, 1.0)
        assert event is not None and event.kind is kind, (kind, line)


def test_the_readers_kind_sets_name_only_members() -> None:
    for kinds in (RUNNER_TASK_KINDS, TIMING_KINDS, TASK_LINE_KINDS):
        assert kinds and set(kinds) <= set(EventKind)
    assert all(isinstance(k, EventKind) for k in RUNNER_TASK_KINDS | TIMING_KINDS)
