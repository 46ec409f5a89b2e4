"""The Why page on stored data (issue 47): the H200 run's store (tests/support/real_gpu.py) opened days later on this
machine, which has no GPU, with the page's default window. Each reading is judged against the GPU it ran on, every
number comes from one window (moved to the last period with activity when the default one holds none), and the page
and ``python -m pages.why --json`` are one view-model: the page's text is compared with the command's output."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from analysis import wording as w
from analysis.story import Status
from pages.shared.window import DEFAULT_WINDOW_S
from pages.why import whatif
from pages.why.view import build_why, hardware_line, placement_words, why_json
from tests.support.paths import REPO
from tests.support.real_gpu import MODEL, real_gpu_store
from tests.support.why_page import diagnoses, figures, open_why, page_text, readings


def why_cli_default(data: Path) -> dict[str, Any]:
    """``python -m pages.why --data D --json`` with nothing else: the page's defaults."""
    out = subprocess.run(
        [sys.executable, "-m", "pages.why", "--data", str(data), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    story: dict[str, Any] = json.loads(out.stdout)
    return story


def test_the_readings_are_judged_against_the_gpu_they_ran_on(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True)
    m = build_why(path, MODEL, window_s=DEFAULT_WINDOW_S)  # the wall clock: days after the run
    assert m is not None and m.window is not None
    # The default window holds none of the run's requests: it moved to the last period with activity.
    assert m.window.moved and m.window.length_s == DEFAULT_WINDOW_S
    assert m.hardware.label == "NVIDIA H200" and m.hardware.kind == "gpu", hardware_line(m.hardware)
    assert not any(n.startswith("No GPU was found") for n in m.notes), m.notes
    assert m.viewer_note is not None and "ran on NVIDIA H200" in m.viewer_note and "no GPU reports" in m.viewer_note
    assert not [r for r in (*m.prefill_points, *m.decode_points) if r.status is Status.IMPOSSIBLE]
    assert not m.doubts, [d.text for d in m.doubts]
    # Tiles, charts and the readings counted from the same 13 requests.
    assert m.requests_total == 13 == m.window_requests == m.diagnosed_requests
    assert len(m.prefill_points) == len(m.decode_points) == 13
    assert m.prefill_median_tok_s is not None and m.decode_median_tok_s is not None
    assert 59.0 <= m.decode_median_tok_s <= 124.0  # the runner's own timings over the run


def test_prior_calibrated_and_measured_apart_with_the_held_out_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    real_gpu_store(data, with_placement=True)
    story = why_cli_default(data)
    assert "NVIDIA H200" in story["hardware"] and story["window"]["moved"]
    for kind in ("prefill", "decode"):
        k = story[kind]
        # The prior is first principles and the hardware table: never fitted, so never the measurement read back.
        assert abs(k["prior_tok_s"] / k["measured_tok_s"] - 1) > 0.2, k
        assert k["expected_tok_s"] == k["prior_tok_s"]
        # The calibrated model's error, measured on readings it was not fitted on.
        err = k["calibrated_held_out_error"]
        assert err is not None and err["readings"] >= 5 and 0 < err["median_abs_error"] <= err["max_abs_error"], k
    assert story["ratio"]["prior"] != story["ratio"]["measured"]


def test_the_page_draws_what_the_command_prints(data_dir: Path) -> None:
    """The page's hardware, placement, medians, readings and verdicts, read as a user sees them, equal the command's."""
    real_gpu_store(data_dir, with_placement=True, with_waits=True)
    story = why_cli_default(data_dir)
    m = build_why(data_dir / "phasewatch.sqlite3", MODEL, window_s=DEFAULT_WINDOW_S)
    assert m is not None and m.placement is not None
    at = open_why()
    text = page_text(at)
    assert story["hardware"] in text and "No GPU was found" not in text
    assert placement_words(m.placement) in text and story["placement"]["devices"][0]["description"] == "NVIDIA H200"
    assert story["viewer_note"] in text and "the last period with activity" in text
    metrics = {x.label: x.value for x in at.metric}
    assert metrics["Prefill, tok/s (median)"] == w.num(story["prefill"]["measured_tok_s"])
    assert metrics["Decode, tok/s (median)"] == w.num(story["decode"]["measured_tok_s"])
    assert metrics["Prefill ÷ decode"] == w.times(story["ratio"]["measured"])
    assert metrics["Prior ratio"] == w.times(story["ratio"]["prior"])
    figs = figures(at)
    for kind, title in (("prefill", "Prefill"), ("decode", "Decode")):
        excluded = sum(x["count"] for x in story[kind]["readings_excluded"])
        assert len(readings(figs[title])) == story[kind]["readings_counted"] + excluded
        # Three things apart on the chart: the ceiling, the prior (never fitted) and the calibrated line.
        names = [str(t.get("name", "")) for t in figs[title]["data"]]
        assert [n.split(" (")[0] for n in names if n.startswith(("ceiling", "expected"))] == [
            "ceiling",
            "expected, calibrated",
            "expected, prior",
        ], names
    groups = diagnoses(at)
    judged = story["requests"]["diagnosed"]
    assert {what: counts for what, (counts, _) in groups.items()} == {
        v["what"]: f"{v['count']:,} of {judged:,}" for v in story["verdicts"]
    }
    assert story == json.loads(json.dumps(why_json(m), default=str)) | {"viewer_note": story["viewer_note"]}
    assert "impossible" not in text and "cannot be true" not in text


def test_the_decode_ceiling_reads_the_weights_the_runner_said(tmp_path: Path) -> None:
    """Issue 40 item 4: the runner printed its buffers (CUDA0 model 6,314 MiB; 540 MiB of token embeddings kept in
    system memory): the ceilings use them, not the catalogue's estimate from the parameter count (6.81 GB)."""
    path = real_gpu_store(tmp_path / "said", with_placement=True)
    m = build_why(path, MODEL, window_s=DEFAULT_WINDOW_S)
    assert m is not None and m.facts is not None and m.story is not None and m.placement is not None
    runner = m.placement.runner
    assert runner is not None and runner.gpu_model_bytes is not None
    assert m.facts.weights_bytes == runner.gpu_model_bytes and not m.facts.weights_bytes_estimated
    assert round(runner.gpu_model_bytes / 2**20) == 6314
    c, bandwidth = m.story.ceilings, m.hardware.bandwidth_bytes_s
    kv = c.kv_bytes_per_tok * c.context_tokens
    assert bandwidth is not None and c.decode_ceiling_tok_s == bandwidth / (runner.gpu_model_bytes + kv)
    assert any("Weights read per token: 6.62 GB, from the runner's own load lines" in n for n in m.notes), m.notes
    # Without its load lines the catalogue's estimate is the fallback, said so.
    bare = build_why(real_gpu_store(tmp_path / "bare", with_placement=False), MODEL, window_s=DEFAULT_WINDOW_S)
    assert bare is not None and bare.facts is not None and bare.facts.weights_bytes_estimated
    assert any(n.startswith("Weight bytes (6.81 GB) are estimated") for n in bare.notes), bare.notes


def test_what_if_starts_from_the_runners_settings_and_loaded_sizes(data_dir: Path) -> None:
    """Issue 40 item 6: What-if's 'now' is the runner's -np 2 and its loaded buffers (the demo's once assumed 1 slot
    and predicted 5.95 GB beside 9.80 GB loaded); its rates say the calibrated model's measured error."""
    path = real_gpu_store(data_dir, with_placement=True)
    m = build_why(path, MODEL, window_s=DEFAULT_WINDOW_S)
    assert m is not None
    force = whatif.in_force(m)
    assert force.settings.num_parallel == 2 and "-np" in next(r.source for r in force.rows if r.name == "num_parallel")
    result = whatif.build_whatif(m, force.settings, None)
    assert result is not None and result.loaded is not None
    # CUDA0: weights 6,314 MiB, KV 3,520 MiB, compute 874 MiB; system memory: 540 MiB of token embeddings.
    assert round(result.loaded.total_bytes / 2**20) == 6314 + 540 + 3520 + 874
    bars = whatif.memory_figure(result).to_dict()["data"]
    assert bars[0]["y"][0] == "loaded (the runner's words)"
    text = page_text(open_why())
    assert f"Now: {w.gb(result.loaded.total_bytes)} loaded by the runner's own load lines" in text
    assert "the calibrated model was off by a median of" in text


def test_without_gpu_samples_the_gpu_is_the_one_the_runner_placed_it_on(tmp_path: Path) -> None:
    """No GPU sample of the readings' time (a log imported without a sampler): the runner's own load lines named the
    GPU (CUDA0, NVIDIA H200), so the readings are judged against it, said so, not against this machine's CPU."""
    path = real_gpu_store(tmp_path / "data", with_placement=True)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM gpu_samples")
        conn.execute("DELETE FROM gpu_minutes")
    conn.close()
    m = build_why(path, MODEL, window_s=DEFAULT_WINDOW_S)
    assert m is not None and m.hardware.spec is not None and m.hardware.spec.key == "h200"
    assert any("the one the runner's own load lines placed the model on (CUDA0, NVIDIA H200)" in n for n in m.notes)
    assert not [r for r in (*m.prefill_points, *m.decode_points) if r.status is Status.IMPOSSIBLE]
