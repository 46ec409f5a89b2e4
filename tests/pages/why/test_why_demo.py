"""The demo's Why headline: the measured prefill ÷ decode ratio and the prior's (never fitted) agree within 2×.

The whole path the demo runs: ``python -m sim`` (a simulated RTX 4090, two slots), ``python -m collectors
--demo`` (proxy, poller, the simulator's GPU) into a real store, and the demo's own synthetic users
(``collectors.demo.Traffic``: a growing chat conversation, documents to summarise) sending through the
proxy with the official client. Then the Why page's model is built from that store.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.ceilings import starting_efficiencies
from analysis.story import RateSample, build_story
from collectors.demo import CHAT_MODEL, QUESTIONS, Traffic
from collectors.lock import read_lock
from pages.why.view import build_why
from store import queries
from store.schema import db_path
from tests.e2e.support import REPO, START_TIMEOUT_S, _stop, wait_until
from tests.support.ports import free_port
from tests.support.sim_process import start_sim

CHAT_TURNS = 10
DOCUMENTS = 3
# Measured and the prior within 2× of each other. The prior is first principles and the hardware table, never
# fitted (issue 40): on the simulator it expects 127× where 76× is measured (sim's decode runs nearer its bandwidth
# than the prior's 70%), on the real H200 it expects more decode than was measured. The calibrated model, fitted
# on the readings, is held to its own error on readings it never saw (analysis.story.held_out_errors).
RATIO_AGREEMENT = 2.0


def _requests_stored(data_dir: Path, n: int) -> bool:
    conn = queries.open_readonly(data_dir)
    try:
        rows = queries.rate_rows(conn, CHAT_MODEL, 0.0)
        return len(rows) >= n and queries.model_info(conn, CHAT_MODEL) is not None and bool(queries.latest_loaded_models(conn))
    finally:
        conn.close()


@pytest.mark.slow
def test_demo_why_headline_ratio_matches_the_expected_ratio(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    with start_sim("--hardware", "rtx-4090", "--num-parallel", "2") as sim:
        proxy = f"127.0.0.1:{free_port()}"
        with open(tmp_path / "collector.log", "wb") as log:
            collector = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collectors",
                    "--ollama",
                    sim.base_url,
                    "--listen",
                    proxy,
                    "--data",
                    str(data_dir),
                    "--demo",
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: (i := read_lock(data_dir)) is not None and i.listen == proxy, START_TIMEOUT_S, "the collector")
            # The demo's users, their requests made one at a time (the demo's own timers wait tens of seconds).
            traffic = Traffic(f"http://{proxy}", threading.Event(), seed=7)
            conversation: list[dict[str, str]] = []
            for turn in range(CHAT_TURNS):
                conversation.append({"role": "user", "content": traffic._rng.choice(QUESTIONS)})
                traffic._chat_turn(conversation)
                if turn % 4 == 1 and turn // 4 < DOCUMENTS:
                    words = ("report", "quarter", "revenue", "growth", "team", "plan", "risk", "data")
                    traffic._summarise(" ".join(traffic._rng.choice(words) for _ in range(traffic._rng.randint(1500, 4000))))
            sent = CHAT_TURNS + min(DOCUMENTS, len([t for t in range(CHAT_TURNS) if t % 4 == 1]))
            wait_until(lambda: _requests_stored(data_dir, sent), 60, "the demo's requests in the store")
        finally:
            _stop(collector)

    why = build_why(db_path(data_dir), CHAT_MODEL)
    assert why is not None and why.simulated and why.story is not None and why.facts is not None
    starting = starting_efficiencies(why.story.model.spec, why.facts.quantization)
    samples = [RateSample(r.request_id, r.tokens, r.rate_tok_s, None, None, None) for r in why.prefill_points] + [
        RateSample(r.request_id, None, None, r.tokens, r.timed_tokens + 1, r.rate_tok_s) for r in why.decode_points
    ]
    measured, expected = why.ratio, why.expected_ratio
    assert measured is not None and expected is not None
    story = why.story
    uncalibrated = build_story(replace(story.model, efficiencies=starting), samples, calibrate_on_samples=False)
    print(
        f"demo headline: measured {measured:.1f}×, prior {expected:.1f}×, "
        f"{uncalibrated.expected_ratio:.1f}× with the starting efficiencies; "
        f"{len(story.counted('prefill'))} prefill and {len(story.counted('decode'))} decode readings count; "
        f"medians {story.prefill_median_tok_s} / {story.decode_median_tok_s}, starting expected "
        f"{uncalibrated.expected_prefill_tok_s} / {uncalibrated.expected_decode_tok_s}"
    )
    assert 1 / RATIO_AGREEMENT <= measured / expected <= RATIO_AGREEMENT, (measured, expected, why.sentences[:2])
    # The headline sentence states both, for the same prompts and contexts.
    assert "prefill ran" in why.sentences[0] and "(before any reading) expect about" in why.sentences[0]
