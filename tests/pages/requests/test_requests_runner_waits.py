"""The Requests detail of a request the runner made wait (the H200 run, tests/support/real_gpu.py): the time before
prefill is named after what the runner said it did, with its size, and not called a queue for a slot."""

from __future__ import annotations

from pathlib import Path

from pages.requests.view import build_detail, explain, runner_waits_of
from tests.support.real_gpu import real_gpu_store

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"  # 272 tokens, sent after a 16,414-token prompt; the other slot was free


def test_the_waterfall_names_the_prompt_cache_save(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True, with_waits=True)
    d = build_detail(path, AFTER_16K)
    assert d is not None
    bars = {t.name: (float(t.base[0]), float(t.x[0])) for t in d.waterfall.data}
    (named,) = [name for name in bars if name.startswith("runner: ")]
    # The bar names the first part and counts the rest (2 checkpoints erased, the re-processing); the verdict lists all.
    assert named == "runner: prompt-cache save 1,362 MiB +2 more" and "queue" not in bars
    assert 1500 < bars[named][1] < 1800  # ms: the 1.65 s between the request and its prefill
    # Every diagnosis (the detail words the most important one among its sentences, the others below them).
    codes = [x.code for x in explain(path, d.record, d.phases, runner_waits_of(path, d.record, d.phases))[1]]
    assert "ttft_runner_wait" in codes and "ttft_queue" not in codes, codes
    assert not any("waiting for a slot" in s for s in d.sentences), d.sentences


def test_without_the_runners_lines_it_is_an_unexplained_wait_not_a_queue(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True)
    d = build_detail(path, AFTER_16K)
    assert d is not None
    names = [t.name for t in d.waterfall.data]
    # The other slot was free (the runner's -np 2) and no other prompt was being read: not a queue for a slot.
    assert "wait (unexplained)" in names and "queue" not in names and not any(n.startswith("runner: ") for n in names)
    codes = [x.code for x in d.diagnoses]
    assert "ttft_wait_unexplained" in codes and "ttft_queue" not in codes, codes
