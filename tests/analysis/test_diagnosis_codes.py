"""Diagnosis codes are one vocabulary (analysis.diagnose.DiagnosisCode): its values never change (they are stored and
exported), and every table keyed by them names only members; the meanings and the fixes name every one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.diagnose import CODES, Diagnosis, DiagnosisCode, Severity
from analysis.doubt import ADVICE_FROM, GPU, MODEL_SIZE, PLACEMENT
from pages.why.report import DIAGNOSIS_FIXES

ROOT = Path(__file__).resolve().parents[2]
# The values as released: exports (the Why page's JSON, the report) and stored data carry them.
RELEASED = {
    "partial_offload",
    "memory_clock_low",
    "power_capped",
    "cache_hit",
    "cache_suspected",
    "one_token_reply",
    "ttft_load",
    "ttft_prompt",
    "ttft_queue",
    "ttft_runner_wait",
    "interference",
    "ttft_wait_unexplained",
    "decode_above_ceiling",
    "decode_slow",
    "decode_speculative",  # added with speculative decoding (issue 41)
    "prefill_above_ceiling",
    "prompt_truncated",
    "num_ctx_ignored",
}


def test_the_values_are_the_released_ones() -> None:
    assert {c.value for c in DiagnosisCode} == RELEASED


def test_every_code_has_its_meaning_and_nothing_else_does() -> None:
    assert set(CODES) == set(DiagnosisCode)
    assert all(isinstance(k, DiagnosisCode) and v.strip() for k, v in CODES.items())


def test_the_why_report_s_fixes_name_every_code_and_nothing_else() -> None:
    assert set(DIAGNOSIS_FIXES) == set(DiagnosisCode)
    assert all(isinstance(k, DiagnosisCode) for k in DIAGNOSIS_FIXES)
    # A fix is a phrase or None (nothing to change), never an empty string that prints "Fix: ."
    assert all(fix is None or fix.strip() for fix in DIAGNOSIS_FIXES.values())


def test_advice_from_each_input_names_only_codes() -> None:
    assert set(ADVICE_FROM) == {PLACEMENT, GPU, MODEL_SIZE}
    for codes in ADVICE_FROM.values():
        assert codes and all(isinstance(c, DiagnosisCode) for c in codes)


def test_a_diagnosis_refuses_a_code_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError):
        Diagnosis("decode_slowish", Severity.INFO, "Decode was slowish.")  # type: ignore[arg-type]
    assert Diagnosis("decode_slow", Severity.INFO, "x").code == DiagnosisCode.DECODE_SLOW  # type: ignore[arg-type]


def literal_codes(root: Path) -> list[str]:
    """Each string literal in the product that spells a diagnosis code outside the enums that declare the values."""
    found = []
    for package in ("analysis", "collectors", "store", "pages", "sim"):
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            enums = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in ("DiagnosisCode", "Flag")]
            inside = {id(node) for enum in enums for node in ast.walk(enum)}
            found += [
                f"{path.relative_to(root).as_posix()}: {node.value}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and node.value in RELEASED and id(node) not in inside
            ]
    return found


def test_the_product_spells_no_code_as_a_string() -> None:
    """Outside the enum a code is written DiagnosisCode.X; a literal would slip past every check above.

    Flag (analysis.phases) declares four of the same values for its own vocabulary; the names below are other
    vocabularies that happen to share a word.
    """
    other_vocabularies = {
        "analysis/diagnose.py: interference",  # a part of the wait, in the numbers of ttft_runner_wait
        "collectors/lab/experiments.py: interference",  # the Lab's experiment
        "pages/lab/figures.py: interference",  # its figure
    }
    assert sorted(set(literal_codes(ROOT)) - other_vocabularies) == []
