"""``python -m pages.why --json`` on the store of the run on a real NVIDIA H200 (tests/support/real_gpu.py): the
story the page draws, as data; the runner's own waits before each prompt named with their sizes, not blamed on a
queue for a slot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pages.why.view import build_why, why_json
from tests.support.paths import REPO
from tests.support.real_gpu import MODEL, real_gpu_store

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"  # the 272-token prompt sent after the 16,414-token one (proxied)


def why_cli(data: Path, *extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "pages.why", "--data", str(data), "--model", MODEL, "--window-s", "7200", "--json", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    story: dict[str, Any] = json.loads(out.stdout)
    return story


def test_the_story_as_data_on_the_h200_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True, with_waits=True)
    story = why_cli(data)
    p = story["placement"]
    assert p["gpu_fraction"] == 1.0 and "runner's own load lines" in p["source"]
    (cuda0, host) = p["devices"]
    assert (cuda0["name"], cuda0["description"], cuda0["layers"]) == ("CUDA0", "NVIDIA H200", 49)
    assert round(cuda0["bytes"]["model"] / 2**20) == 6314 and host["name"] == "CPU"
    decode = story["decode"]
    assert decode["readings_counted"] == 11
    assert [(x["status"], x["count"]) for x in decode["readings_excluded"]] == [("tiny", 2)]
    assert 1 / 2 <= decode["expected_tok_s"] / decode["measured_tok_s"] <= 2, decode
    assert story["prefill"]["readings_counted"] >= 10
    codes = {v["code"]: v for v in story["verdicts"]}
    assert not {"partial_offload", "decode_above_ceiling"} & set(codes), list(codes)
    # The runner copied the idle slot's 16k conversation (1,362 MiB) into its RAM prompt cache before it read the
    # 272-token prompt: named, with its size, and not a queue for a slot (the other slot was free).
    assert "ttft_queue" not in codes, codes["ttft_queue"]["text"]
    waits = codes["ttft_runner_wait"]
    after = waits["by_request"][AFTER_16K]
    assert round(after["prompt_cache_save_mib"]) == 1362 and after["runner_wait_s"] > 1.0
    assert "prompt cache" in waits["text"] and "MiB" in waits["text"] and "--cache-ram" in waits["text"]
    assert waits["count"] >= 2


def test_the_command_and_the_page_share_one_view_model(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = real_gpu_store(data, with_placement=True, with_waits=True)
    # Both at the wall clock, days after the run: both move to the window ending at the newest request.
    m = build_why(path, MODEL, window_s=7200)
    assert m is not None and m.window is not None and m.window.moved
    assert why_cli(data) == json.loads(json.dumps(why_json(m), default=str))


def test_with_slots_alone_the_wait_is_unexplained(tmp_path: Path) -> None:
    """Without the runner's log lines the same wait is not blamed on a queue: a slot was free."""
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True)
    codes = {v["code"]: v for v in why_cli(data)["verdicts"]}
    assert "ttft_queue" not in codes and "ttft_runner_wait" not in codes
    unexplained = codes["ttft_wait_unexplained"]
    assert AFTER_16K in unexplained["by_request"] and "while a slot was free" in unexplained["text"]
