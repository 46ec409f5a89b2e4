"""Issue 41 item 2 (in part): a cloud model's request (``:cloud`` / ``-cloud`` tags, run on ollama.com, no local
runner) keeps its counts and the client's times only: Ollama's durations in its reply are not this machine's phases,
no local ceiling or diagnosis judges it, and it says so."""

from __future__ import annotations

import dataclasses

from analysis.diagnose import diagnose_request
from analysis.model_names import is_cloud
from analysis.phases import Flag, PhaseSource, split_record
from analysis.records import RequestRecord
from tests.support.diagnose_cases import FACTS, SPEC, make_record

MS = 1_000_000


def test_cloud_names_as_ollama_tags_them() -> None:
    assert is_cloud("gpt-oss:120b-cloud") and is_cloud("glm-4.6:cloud") and is_cloud("GPT-OSS:20B-CLOUD")
    assert not is_cloud("gpt-oss:120b") and not is_cloud("cloud") and not is_cloud("mycloud:latest")
    assert not is_cloud("localhost:5000/cloud")  # a registry's port, not a tag


def cloud_record() -> RequestRecord:
    """A streamed chat whose reply carries Ollama's durations (as ollama.com sends them) and 500 tok/s of decode:
    beyond this machine's ceiling, and no matter, since it did not run here."""
    rec = make_record(token_gap_ms=2)
    rec.model = "gpt-oss:120b-cloud"
    assert rec.metrics is not None
    rec.metrics = dataclasses.replace(rec.metrics, load_duration_ns=3 * MS, prompt_eval_duration_ns=40 * MS)
    return rec


def test_a_cloud_request_has_no_local_phases_and_says_so() -> None:
    rec = cloud_record()
    local = dataclasses.replace(rec, model="gpt-oss:120b")
    ph, ph_local = split_record(rec), split_record(local)
    assert ph_local.load_s is not None and ph_local.prefill_s is not None  # a local model: Ollama's durations placed
    assert ph.load_s is None and ph.prefill_s is None and ph.queue_s is None  # not this machine's: unknown, never 0
    assert ph.ttft_s == ph_local.ttft_s and ph.ttft_s is not None  # the client's time is the client's
    assert ph.prompt_tokens == ph_local.prompt_tokens and ph.output_tokens == ph_local.output_tokens
    assert ph.prompt_tokens_source is PhaseSource.OLLAMA
    assert ph.decode_tok_s is not None  # timed from the stream, as the client saw it
    assert Flag.CLOUD in ph.flags and "ran on ollama.com" in ph.flag_text[Flag.CLOUD]
    assert Flag.IMPLAUSIBLE_DECODE_RATE not in ph.flags


def test_no_local_ceiling_or_diagnosis_judges_a_cloud_request() -> None:
    rec = cloud_record()
    local = dataclasses.replace(rec, model="gpt-oss:120b")
    assert diagnose_request(local, split_record(local), spec=SPEC, facts=FACTS)
    assert diagnose_request(rec, split_record(rec), spec=SPEC, facts=FACTS) == []
