"""Speculative decoding: the runner's drafting settings and its own acceptance line, the ceiling they lift and the
verdicts on a decode above the one-token ceiling (analysis.speculative, analysis.ceilings, analysis.diagnose).

The acceptance lines are llama-server's ``print_timings`` format as the binary this project builds holds it
(``strings llama-server``): "draft acceptance = %0.5f (%5d accepted / %5d generated), mean len = %5.2f", after the
slot prefix "slot %12.*s: id %2d | task %d | "; older builds end before ", mean len"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis import roofline
from analysis.ceilings import Ceilings, ceilings_for_request, judge_decode
from analysis.diagnose import CEILING_SLACK, Diagnosis, diagnose_request
from analysis.log_grammar import MAX_LINE_CHARS
from analysis.phases import split_record
from analysis.records import RequestRecord
from analysis.speculative import (
    DraftAcceptance,
    Speculation,
    TokensPerStep,
    acceptance_of_text,
    is_speculating,
    tokens_per_step,
)
from tests.support.diagnose_cases import FACTS, SPEC, make_record
from tests.support.paths import REPO

NEW = "slot print_timing: id  0 | task 7 | draft acceptance = 0.62500 (   50 accepted /    80 generated), mean len =  2.25"
OLD = "slot print_timing: id  1 | task 12 | draft acceptance = 0.75000 (   75 accepted /   100 generated)"
DRAFT = "/usr/share/ollama/.ollama/models/blobs/sha256-" + "d" * 64


SPEC_LOG = REPO / "tests" / "data" / "runner_logs" / "speculative_draft_simple_gemma3_270m.log"


def test_the_acceptance_line_of_a_real_speculative_run() -> None:
    """Captured from the real llama-server started with ``-md`` (the model as its own draft), ``--spec-type
    draft-simple --spec-draft-n-max 4``: one task, 37 of 37 drafted tokens accepted, 4.70 tokens a step."""
    said = [a for line in SPEC_LOG.read_text().splitlines() if (a := acceptance_of_text(line)) is not None]
    assert said == [DraftAcceptance(37, 37, 4.70)]
    spec = Speculation("/m/gemma-3-270m-q4_k_m.gguf", ("draft-simple",), 4, None)
    assert tokens_per_step(spec, said[0]) == TokensPerStep(4.70, True)


def test_the_runners_acceptance_line_new_and_old() -> None:
    assert acceptance_of_text(NEW) == DraftAcceptance(50, 80, 2.25)
    old = acceptance_of_text(OLD)
    assert old == DraftAcceptance(75, 100, None) and old.acceptance == 0.75
    prefixed = "0.09.894.504 I " + NEW
    assert acceptance_of_text(prefixed) == DraftAcceptance(50, 80, 2.25), "llama.cpp's optional log prefix"


@pytest.mark.parametrize(
    "line",
    [
        NEW + " and more",  # anchored at its end
        NEW.replace("print_timing", "launch_slot_"),  # only print_timings prints it
        "srv  print_timing: draft acceptance = 0.62500 (   50 accepted /    80 generated), mean len =  2.25",  # no slot
        NEW.replace("(   50 accepted", "(   90 accepted"),  # more accepted than drafted
        NEW.replace("0.62500", "0.90000"),  # the rate printed is accepted ÷ drafted
        "slot print_timing: id  0 | task 7 | draft acceptance = 0.00000 (    0 accepted /     0 generated)",
        NEW.replace("mean len =  2.25", "mean len =  0.50"),  # a step yields its own token at least
        'msg="draft acceptance = 0.62500 (   50 accepted /    80 generated)"',
        "x" * MAX_LINE_CHARS + NEW,
        NEW.replace("   50", "9" * 30),
    ],
)
def test_lines_that_are_not_the_runners_acceptance(line: str) -> None:
    assert acceptance_of_text(line) is None


@given(st.text(max_size=200), st.integers(0, len(NEW)))
def test_any_text_spliced_into_the_line_is_read_or_refused_never_fatal(noise: str, at: int) -> None:
    said = acceptance_of_text(NEW[:at] + noise + NEW[at:])
    assert said is None or (0 <= said.accepted_tokens <= said.drafted_tokens and said.drafted_tokens > 0)
    assert said is None or said.mean_tokens_per_step is None or said.mean_tokens_per_step >= 1.0


def test_tokens_per_step_measured_else_the_settings_bound_else_unknown() -> None:
    said = DraftAcceptance(50, 80, 2.25)
    assert tokens_per_step(Speculation(DRAFT, (), 3, None), said) == TokensPerStep(2.25, True), "measured wins"
    assert tokens_per_step(Speculation(DRAFT, (), 3, None), None) == TokensPerStep(4.0, False), "1 + --spec-draft-n-max"
    assert tokens_per_step(Speculation(None, ("draft-mtp",)), None) is None, "drafting, by how much nothing says"
    assert tokens_per_step(None, DraftAcceptance(75, 100, None)) is None
    assert not is_speculating(None, None) and not is_speculating(Speculation(), None)
    assert is_speculating(Speculation(None, ("ngram-mod",)), None) and is_speculating(None, said)


def test_the_ceiling_a_draft_lifts() -> None:
    plain = roofline.decode_ceiling_tok_s(936e9, 4.9e9, 0.0, 0)
    assert roofline.speculative_decode_ceiling_tok_s(plain, 2.5) == pytest.approx(2.5 * plain)
    assert roofline.speculative_decode_ceiling_tok_s(plain, 0.3) == plain, "a step yields its own token at least"
    rec = make_record(token_gap_ms=2)  # 500 tok/s where a 3090 reads 4.9 GB at most ~190 times a second
    c = diagnose_ceilings(rec)
    assert judge_decode(500.0, c).above_ceiling
    lifted = judge_decode(500.0, c, tokens_per_step=3.0)
    assert not lifted.above_ceiling and lifted.ceiling_tok_s == pytest.approx(3 * c.decode_ceiling_tok_s)


def diagnose_ceilings(rec: RequestRecord) -> Ceilings:
    phases = split_record(rec)
    return ceilings_for_request(SPEC, FACTS, prompt_tokens=phases.prompt_tokens, output_tokens=phases.output_tokens)


def decode_verdict(**kw: object) -> Diagnosis:
    rec = make_record(token_gap_ms=2)  # 500 tok/s: above the 189 tok/s one read of 4.95 GB a step allows on a 3090
    found = diagnose_request(rec, split_record(rec), spec=SPEC, facts=FACTS, **kw)  # type: ignore[arg-type]
    found = [d for d in found if "decode" in d.code]
    assert len(found) == 1, found
    return found[0]


def test_without_a_draft_a_decode_above_the_ceiling_is_still_impossible() -> None:
    d = decode_verdict()
    assert d.code == "decode_above_ceiling" and "cannot be true" in d.sentence
    off = decode_verdict(speculation=Speculation(None, (), None, None))
    assert off.code == "decode_above_ceiling", "settings that draft nothing change nothing"


def test_with_a_draft_it_is_explained_with_the_numbers() -> None:
    d = decode_verdict(speculation=Speculation(None, ("draft-mtp",)), draft=DraftAcceptance(150, 160, 3.6))
    assert d.code == "decode_speculative" and "cannot be true" not in d.sentence
    plain = d.numbers["ceiling_tok_s"]
    assert d.numbers["measured_tok_s"] == pytest.approx(500.0, rel=0.01)
    assert d.numbers["speculative_ceiling_tok_s"] == pytest.approx(3.6 * plain)
    assert "500 tok/s" in d.sentence and f"{plain:.0f} tok/s" in d.sentence and "3.60 at a time" in d.sentence
    assert "150 of 160 drafted tokens accepted" in d.sentence and "one-token-per-weight-read ceiling" in d.sentence


def test_a_draft_bounded_only_by_its_settings() -> None:
    d = decode_verdict(speculation=Speculation(DRAFT, (), 3, None))
    assert d.code == "decode_speculative" and d.numbers["tokens_per_step"] == 4.0
    assert "a draft model (sha256-" in d.sentence and "up to 4 at a time" in d.sentence
    unknown = decode_verdict(speculation=Speculation(None, ("ngram-mod",)))
    assert unknown.code == "decode_speculative" and "not known" in unknown.sentence
    assert unknown.numbers["tokens_per_step_needed"] == pytest.approx(500.0 / unknown.numbers["ceiling_tok_s"], rel=0.01)


def test_above_even_what_the_draft_allows_is_still_impossible() -> None:
    d = decode_verdict(speculation=Speculation(None, ("draft-mtp",)), draft=DraftAcceptance(50, 80, 2.25))
    assert d.code == "decode_above_ceiling" and "cannot be true" in d.sentence
    assert d.numbers["measured_tok_s"] > CEILING_SLACK * d.numbers["speculative_ceiling_tok_s"]
    assert "2.25 tokens per read" in d.sentence
