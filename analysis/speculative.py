"""Speculative decoding: what a runner is set to draft with, and what its own timing line says it accepted.

With a draft (a small draft model, ``--spec-type draft-mtp``'s multi-token-prediction head, an n-gram lookup) the
main model checks several proposed tokens in one step: one read of its weights yields the accepted tokens plus one
of its own. Decode can then beat the one-token-per-weight-read ceiling (``analysis.roofline``) by as many tokens as
a step yields on average; without a draft it cannot.

The settings come from the runner's command line (llama-server's ``--help``, the build this project ships):
``--spec-draft-model``/``-md``/``--model-draft FNAME``, ``--spec-type`` (a comma-separated list of ``none,
draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple, ngram-map-k, ngram-map-k4v,
ngram-mod, ngram-cache``; default none), ``--spec-draft-n-max N`` (default 3) and ``--spec-draft-n-min N`` (older
builds: ``--draft-max``/``--draft-n``/``--draft``, ``--draft-min``/``--draft-n-min``).

What it accepted is llama-server's ``print_timings`` line for a task that drafted (``tools/server/server-context.cpp``,
``SLT_INF``; older builds end before ", mean len")::

    slot print_timing: id  0 | task 7 | draft acceptance = 0.62500 (   50 accepted /    80 generated), mean len =  2.25

``mean len`` is 1 + accepted ÷ verification steps: the tokens one step of the main model yielded on average.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analysis.log_grammar import MAX_LINE_CHARS, RunnerLine, runner_line

SPEC_TYPE_OFF = "none"
MAX_SPEC_TYPES = 8  # types one --spec-type list may name (llama-server knows 11); more are not a runner's
MAX_TYPE_CHARS = 32
MAX_NAME_CHARS = 80  # a draft model's file name as sentences quote it
MAX_DRAFT_TOKENS = 4096  # a --spec-draft-n-max above this is not a setting (llama-server's n-gram default is 64)
MAX_MEAN_LEN = 4097.0  # 1 + MAX_DRAFT_TOKENS: tokens one verification step can yield
RATE_PRINT_SLACK = 1e-5  # "%0.5f" of accepted ÷ drafted rounds by at most half of this
TIMING_FUNC = "print_timing"  # print_timings, cut to 12 by the slot line's format

_ACCEPTANCE = re.compile(
    r"draft acceptance = (?P<rate>[0-9]{1,4}\.[0-9]{5}) \( *(?P<accepted>[0-9]{1,12}) accepted / "
    r"*(?P<drafted>[0-9]{1,12}) generated\)(?:, mean len = +(?P<mean>[0-9]{1,5}\.[0-9]{2}))?"
)
_TYPE = re.compile(r"[a-z0-9][a-z0-9-]{0," + str(MAX_TYPE_CHARS - 1) + "}")


@dataclass(frozen=True)
class Speculation:
    """A runner's speculative-decoding settings as its command line gives them. None: not given (the runner's own
    default holds: no draft model, ``--spec-type none``, ``--spec-draft-n-max`` 3 in today's builds)."""

    draft_model: str | None = None  # the draft GGUF's path
    spec_types: tuple[str, ...] = ()  # --spec-type's list, "none" left out
    draft_max_tokens: int | None = None  # tokens drafted per step at most
    draft_min_tokens: int | None = None

    @property
    def active(self) -> bool:
        """Whether the runner drafts at all: a draft model, or a speculative type other than none."""
        return self.draft_model is not None or bool(self.spec_types)

    def describe(self) -> str:
        """ "a draft model (qwen3-0.6b.gguf), --spec-type draft-mtp, up to 3 drafted tokens a step"."""
        parts = []
        if self.draft_model is not None:
            parts.append(f"a draft model ({draft_file_name(self.draft_model)})")
        if self.spec_types:
            parts.append("--spec-type " + ",".join(self.spec_types))
        if self.draft_max_tokens is not None:
            parts.append(f"up to {self.draft_max_tokens} drafted tokens a step")
        return ", ".join(parts) if parts else "no draft"


def draft_file_name(path: str) -> str:
    """The draft model's file name, without its folders, cut to ``MAX_NAME_CHARS``."""
    name = re.split(r"[\\/]", path)[-1]
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 1] + "…"


def spec_types_of(text: str | None) -> tuple[str, ...] | None:
    """``--spec-type``'s list, lowercased, "none" left out; None for a value no llama-server takes (too many
    names, a name out of form)."""
    if text is None:
        return ()
    names = [n.strip().lower() for n in text.split(",")]
    if len(names) > MAX_SPEC_TYPES or not all(_TYPE.fullmatch(n) for n in names):
        return None
    return tuple(dict.fromkeys(n for n in names if n != SPEC_TYPE_OFF))


def draft_tokens_of(text: str | None) -> int | None:
    """A draft-size setting's value: a count from 0 to ``MAX_DRAFT_TOKENS``, else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 6:
        return None
    n = int(text)
    return n if n <= MAX_DRAFT_TOKENS else None


@dataclass(frozen=True)
class DraftAcceptance:
    """One task's drafting, as the runner's timing line says it: tokens accepted of those drafted and, from newer
    builds, the tokens one verification step yielded on average (its own token included)."""

    accepted_tokens: int
    drafted_tokens: int
    mean_tokens_per_step: float | None  # "mean len"; None from a build that does not print it

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens > 0 else None


def acceptance_of(line: RunnerLine) -> DraftAcceptance | None:
    """The drafting a slot's ``draft acceptance`` timing line reports, or None for any other line (or one whose
    figures contradict each other: more accepted than drafted, a rate that is not accepted ÷ drafted, a mean step
    under one token)."""
    if not line.is_slot or line.func != TIMING_FUNC:
        return None
    m = _ACCEPTANCE.fullmatch(line.message.rstrip(" "))
    if m is None:
        return None
    accepted, drafted = int(m.group("accepted")), int(m.group("drafted"))
    mean = float(m.group("mean")) if m.group("mean") is not None else None
    if not 0 <= accepted <= drafted or drafted == 0 or (mean is not None and not 1.0 <= mean <= MAX_MEAN_LEN):
        return None
    if abs(float(m.group("rate")) - accepted / drafted) > RATE_PRINT_SLACK:  # the runner prints accepted ÷ drafted
        return None
    return DraftAcceptance(accepted, drafted, mean)


def acceptance_of_text(line: str) -> DraftAcceptance | None:
    """``acceptance_of`` for a raw line (split by ``analysis.log_grammar``); None for one over ``MAX_LINE_CHARS``."""
    if len(line) > MAX_LINE_CHARS or "draft acceptance" not in line:
        return None
    split = runner_line(line)
    return acceptance_of(split) if split is not None else None


def is_speculating(spec: Speculation | None, said: DraftAcceptance | None) -> bool:
    """Whether decode may yield more than one token per step: the settings draft, or the runner said it drafted."""
    return (spec is not None and spec.active) or said is not None


@dataclass(frozen=True)
class TokensPerStep:
    """How many tokens one read of the main model's weights may yield while drafting, and where that comes from."""

    tokens: float
    measured: bool  # True: the runner's own mean for this task; False: the most its settings allow


def tokens_per_step(spec: Speculation | None, said: DraftAcceptance | None) -> TokensPerStep | None:
    """Tokens one decode step of a drafting runner yields: the runner's measured mean when it printed one, else
    1 + the most it may draft (its ``--spec-draft-n-max``), else None (it drafts, but by how much nothing says)."""
    if said is not None and said.mean_tokens_per_step is not None:
        return TokensPerStep(said.mean_tokens_per_step, True)
    if spec is not None and spec.draft_max_tokens is not None:
        return TokensPerStep(1.0 + spec.draft_max_tokens, False)
    return None
