"""The Lab page in AppTest: never runs on load, runs on a click, shows progress, cancels, charts and compares.

The app runs in-process with ``PHASEWATCH_COLLECTOR=off``; ``PHASEWATCH_LISTEN`` points the
page's "proxy" at a sim on a free port, so a click starts a real ``python -m collectors.lab``
process against a real HTTP server.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from collectors.lab.results import CANCELLED, DONE, FAILED, ExperimentResult, RunState, lab_dir, list_results, write_result
from tests.support.paths import REPO
from tests.support.sim_process import SimProcess

APP = str(REPO / "app.py")
TIMEOUT_S = 60
MODEL = "qwen2.5:0.5b"

pytestmark = pytest.mark.sim_args("--hardware", "rtx-3090", "--num-parallel", "2")


@pytest.fixture
def data_dir(data_dir: Path, monkeypatch: pytest.MonkeyPatch, sim: SimProcess) -> Path:
    """The root data folder, with the app pointed at the module's sim as if a collector listened there."""
    monkeypatch.setenv("PHASEWATCH_LISTEN", f"127.0.0.1:{sim.port}")
    return data_dir


def truth(sim: SimProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(sim.base_url + "/sim/truth", timeout=5) as r:
        return list(json.load(r)["requests"])


def clear_truth(sim: SimProcess) -> None:
    urllib.request.urlopen(urllib.request.Request(sim.base_url + "/sim/truth", method="DELETE"), timeout=5).close()


def lab_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    at.switch_page("pages/lab/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Lab"
    return at


def rerun(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def button(at: AppTest, label: str) -> Any:
    return next(b for b in at.button if b.label == label)


def wait_for(at: AppTest, cond: Any, timeout_s: float = 40.0) -> AppTest:
    deadline = time.monotonic() + timeout_s
    while not cond(at):
        assert time.monotonic() < deadline, "the page never reached the expected state"
        time.sleep(0.3)
        rerun(at)
    return at


def text_of(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [t.value for t in at.text]
    parts += [e.value for e in (*at.info, *at.warning, *at.error, *at.caption)]
    return "\n".join(str(p) for p in parts)


def test_opening_the_page_runs_nothing_and_shows_the_cost(data_dir: Path, sim: SimProcess) -> None:
    clear_truth(sim)
    at = lab_page()
    at.selectbox(key="lab_exp").select("concurrency")
    rerun(at)
    assert "What do several streams at once get" in text_of(at)
    # Warm-up plus 1 + 2 + 4 streams of 48 tokens.
    text = text_of(at)
    assert "Sends 8 requests (the first a warm-up that gives no point): about" in text and "337 output tokens" in text
    assert button(at, "Run experiment").disabled  # no model chosen yet
    at.text_input(key="lab_model_text").input(MODEL)
    rerun(at)
    assert not button(at, "Run experiment").disabled
    rerun(at)
    time.sleep(0.5)
    assert truth(sim) == [] and not lab_dir(data_dir).exists()
    assert "No runs yet" in text_of(at)
    at.selectbox(key="lab_exp").select("cold-warm")
    rerun(at)
    assert any("unloads the model first" in w.value for w in at.warning)
    # Impossible parameters: said plainly, and nothing can be started.
    at.selectbox(key="lab_exp").select("prompt-length")
    rerun(at)
    at.number_input(key="lab_p_prompt-length_min_prompt_tokens").set_value(9000)
    rerun(at)
    assert any("larger than max" in e.value for e in at.error)
    assert not any(b.label == "Run experiment" for b in at.button)


def test_click_runs_follows_progress_and_charts_the_result(data_dir: Path, sim: SimProcess) -> None:
    older = _doc("older", time.time() - 600, 100.0)
    write_result(lab_dir(data_dir) / "older.json", older)
    at = lab_page()
    assert at.selectbox(key="lab_selected").value == "older"
    at.selectbox(key="lab_exp").select("prompt-length")
    at.text_input(key="lab_model_text").input(MODEL)
    rerun(at)
    at.number_input(key="lab_p_prompt-length_max_prompt_tokens").set_value(512)
    at.number_input(key="lab_num_ctx").set_value(8192)
    rerun(at)
    button(at, "Run experiment").click()
    rerun(at)
    assert button(at, "Run experiment").disabled  # one run at a time
    wait_for(at, lambda a: a.selectbox(key="lab_selected").value != "older")
    runs = [r for r in list_results(data_dir) if r.run_id != "older"]
    assert len(runs) == 1 and runs[0].state == DONE
    assert [p["prompt_tokens_target"] for p in runs[0].points] == [64, 128, 256, 512]
    assert at.selectbox(key="lab_selected").value == runs[0].run_id  # the new run is the one shown
    assert runs[0].parameters["num_ctx"] == 8192 and runs[0].summary["context_tokens"] == 8192
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 1
    fig = charts[0]
    assert "Prefill speed and time to first token" in fig["layout"]["title"]["text"]
    xs = next(t["x"] for t in fig["data"] if t["name"].startswith("prefill"))
    assert xs == [p["prompt_tokens"] for p in runs[0].points]
    assert any("Time to first token grew" in i.value for i in at.info)  # the conclusion
    assert at.dataframe[0].value.shape[0] == 4  # the measured points


def test_cancel_from_the_page_stops_the_run_and_its_requests(data_dir: Path, sim: SimProcess) -> None:
    clear_truth(sim)
    at = lab_page()
    at.selectbox(key="lab_exp").select("concurrency")
    at.text_input(key="lab_model_text").input(MODEL)
    rerun(at)
    at.number_input(key="lab_p_concurrency_num_predict").set_value(3000)
    rerun(at)
    button(at, "Run experiment").click()
    rerun(at)
    wait_for(
        at,
        lambda a: (
            any(b.label == "Cancel" for b in a.button)
            and any(len(r["token_sampled_ns"]) > 20 and r["done_ns"] is None for r in truth(sim))
        ),
    )
    assert at.get("progress"), "a progress bar shows while it runs"
    t_cancel_ns = time.monotonic_ns()
    button(at, "Cancel").click()
    rerun(at)
    wait_for(at, lambda a: any(s.value == "Results" for s in a.subheader))
    (run,) = list_results(data_dir)
    assert run.state == CANCELLED
    cut = [r for r in truth(sim) if r["cancelled"]]
    assert cut and all((r["done_ns"] - t_cancel_ns) / 1e9 < 2.0 for r in cut)
    assert any(i.value.startswith("Cancelled") for i in at.info)


def _doc(run_id: str, started: float, scale: float, state: RunState = DONE, error: str | None = None) -> ExperimentResult:
    pts = [{"streams": n, "total_tok_s": scale * n * 0.9, "per_stream_tok_s": scale * (1 - 0.05 * n)} for n in (1, 2, 4)]
    return ExperimentResult(
        "concurrency",
        run_id,
        MODEL,
        "http://127.0.0.1:1",
        {"max_streams": 4},
        started,
        state=state,
        points=pts,
        conclusion=f"conclusion of {run_id}",
        finished_at_unix_s=started + 5,
        error=error,
    )


def test_past_runs_are_listed_and_comparable(data_dir: Path) -> None:
    now = time.time()
    write_result(lab_dir(data_dir) / "old.json", _doc("old", now - 3600, 100.0))
    write_result(lab_dir(data_dir) / "new.json", _doc("new", now - 60, 150.0))
    write_result(lab_dir(data_dir) / "bad.json", _doc("bad", now - 30, 1.0, FAILED, "model '<b>x</b>' not found"))
    at = lab_page()
    # The newest run is shown first: a failed one, its error as plain text.
    assert any("not found" in e.value and "\\<b\\>" in e.value for e in at.error)  # escaped: never markup
    at.selectbox(key="lab_selected").select("new")
    rerun(at)
    assert any(i.value == "conclusion of new" for i in at.info)
    at.multiselect(key="lab_compare_new").select("old")
    rerun(at)
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    totals = [t for t in fig["data"] if t["name"].startswith("total")]
    assert len(totals) == 2  # both runs overlaid
    history = at.dataframe[-1].value
    assert list(history["state"]) == ["failed", "done", "done"]
