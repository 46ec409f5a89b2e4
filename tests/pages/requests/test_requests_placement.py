"""The Requests detail explains a request from the model's basis, the one the Why page uses (pages.shared.basis):
on the H200 run (tests/support/real_gpu.py), where /api/ps said the model sat all in system memory and the runner's
own load lines put 49/49 layers on the GPU, the detail names the runner's placement with its source and /api/ps's
figure beside it, and gives neither advice about offloading nor a reading "above the ceiling"."""

from __future__ import annotations

from pathlib import Path

from analysis.records import Outcome
from pages.requests.view import build_detail, explain, runner_waits_of
from pages.why.view import build_why, why_json
from store import queries
from tests.support.real_gpu import MODEL, real_gpu_store

AFTER_16K = "945a35dea41142cab2de21d57f4c8a92"  # 272 tokens, sent after a 16,414-token prompt; decode 101 tok/s
WRONG_PLACEMENT = {"partial_offload", "decode_above_ceiling"}


def test_the_detail_names_the_runners_placement_and_gives_no_offload_advice(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True, with_waits=True)
    d = build_detail(path, AFTER_16K)
    assert d is not None and d.placement is not None
    assert "49/49 layers on CUDA0 (NVIDIA H200)" in d.placement and "runner's own load lines" in d.placement
    # Both figures where they disagree by more than 10%, and which one is used.
    assert "/api/ps says 0%" in d.placement and "runner's figures are used" in d.placement, d.placement
    assert not any("system memory" in s and "sits" in s for s in d.sentences), d.sentences
    assert not {x.code for x in d.diagnoses} & WRONG_PLACEMENT, [x.code for x in d.diagnoses]


def test_every_fixture_request_gets_the_verdicts_the_why_page_gives_it(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=True, with_waits=True)
    reader = queries.open_readonly(path)
    stored = queries.requests_in_window(reader, 0.0, 4e9, with_tokens=True, limit=1000)
    reader.close()
    last_s = max(s.record.started_at_unix_s for s in stored)
    why = build_why(path, MODEL, now_unix_s=last_s + 60, window_s=1e9)
    assert why is not None
    why_codes: dict[str, set[str]] = {}
    for v in why_json(why)["verdicts"]:
        for rid in v["by_request"]:
            why_codes.setdefault(rid, set()).add(v["code"])
    checked = 0
    for s in stored:
        if s.record.model != MODEL or s.record.metrics is None or s.record.outcome is not Outcome.OK:
            continue
        _, diagnoses, _ = explain(path, s.record, s.phases, runner_waits_of(path, s.record, s.phases))
        codes = {x.code for x in diagnoses}
        assert not codes & WRONG_PLACEMENT, (s.record.id, codes)
        assert codes == why_codes.get(s.record.id, set()), (s.record.id, codes, why_codes.get(s.record.id))
        checked += 1
    assert checked >= 10
