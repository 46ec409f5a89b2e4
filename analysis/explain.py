"""Plain words, built from the user's numbers: where a request's time went, and why prefill ≫ decode.

Every sentence is assembled from the figures passed in (the request's phases, the
ceilings for this GPU and model, measured interference); nothing here is a
canned paragraph. Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from analysis import wording as w
from analysis.ceilings import MIN_CALIBRATION_SAMPLES, MIN_RATE_TOKENS, Ceilings
from analysis.diagnose import Diagnosis, Severity
from analysis.energy import PhaseEnergy
from analysis.interference import Interference, describe
from analysis.phases import Phases
from analysis.records import RequestRecord
from analysis.story import RATIO_SPREAD, EmbedStory, Reading, Status, Story

# Parts of a request shorter than this share of it are left out of the sentence.
MIN_PART_SHARE = 0.02
BATCH_EXAMPLE_STREAMS = 4


def _whose_total(p: Phases) -> str:
    """Which total the sentence splits: Ollama's own differs from the client's "Total" beside it by the transport
    (584 vs 585 ms), so it says whose it is."""
    if p.total_s is not None:
        return " in Ollama"
    return " seen by the client" if p.client_s is not None else ""


def _no_timing(record: RequestRecord, p: Phases, total: float | None) -> str:
    """A request with no phase timed: what the proxy saw of it, or for a direct one what Ollama's access line said."""
    if record.direct:  # no proxy saw it
        took = f"; Ollama's access line says it took {w.secs(total)}" if total is not None else ""
        return f"This request ({record.outcome.value}) carries no timing from a runner{took}."
    seen = f"{p.token_chunks} token chunks" if p.token_chunks else "no tokens"
    took = f" in {w.secs(p.client_s)}" if p.client_s is not None else ""
    return f"This request ({record.outcome.value}) carries no timing from Ollama; the proxy saw {seen}{took}."


def _time_total_s(record: RequestRecord, p: Phases) -> float | None:
    """The time the parts are shares of: Ollama's total, else the client's; a direct record no access line fitted and
    no proxy saw has only its phases."""
    total = p.total_s if p.total_s is not None else p.client_s
    if total is None and record.direct:
        total = sum(v for v in (p.load_s, p.queue_s, p.prefill_s, p.decode_s) if v is not None) or None
    return total


def _time_parts(record: RequestRecord, p: Phases, total_s: float) -> list[str]:
    """Each phase that took at least ``MIN_PART_SHARE`` of ``total_s``, in words."""
    parts: list[str] = []
    if p.load_s and p.load_s >= MIN_PART_SHARE * total_s:
        parts.append(f"{w.secs(p.load_s)} loading {record.model}")
    if p.queue_s and p.queue_s >= MIN_PART_SHARE * total_s:
        parts.append(f"{w.secs(p.queue_s)} waiting before the prompt was read")  # a slot, or the runner's own work
    if p.prefill_s and p.prefill_s >= MIN_PART_SHARE * total_s:
        computed = (p.prompt_tokens or 0) - (p.cached_tokens or 0)
        rate = f" at {w.tok_s(p.prefill_tok_s)}" if p.prefill_tok_s else ""
        # Cache hits are worded once, by the diagnosis, and only when they matter.
        parts.append(f"{w.secs(p.prefill_s)} reading {w.count(computed)} prompt tokens{rate}")
    if p.decode_s and p.decode_s >= MIN_PART_SHARE * total_s:
        rate = f" at {w.tok_s(p.decode_tok_s)}" if p.decode_tok_s else ""
        parts.append(f"{w.secs(p.decode_s)} writing {w.count(p.output_tokens or 0)} tokens{rate}")
    return parts


def _where_time_went(record: RequestRecord, p: Phases) -> str:
    total = _time_total_s(record, p)
    if total is None or total <= 0 or (p.load_s is None and p.prefill_s is None and p.decode_s is None):
        return _no_timing(record, p, total)
    parts = _time_parts(record, p, total)
    if not parts:
        return f"The whole request took {w.secs(total)}."
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"Of {w.secs(total)}{_whose_total(p)}, {listed}."


def explain_thinking(p: Phases) -> str | None:
    """A reply that thought before it answered: what the thinking cost, and the first token against the first answer token.

    None where nothing was thought (or it is not known)."""
    if not p.thinking_tokens:
        return None
    total = p.thinking_tokens + (p.answer_tokens or 0)
    cost = f" in {w.secs(p.thinking_s)}" if p.thinking_s is not None else ""
    rate = f" at {w.tok_s(p.thinking_tok_s)}" if p.thinking_tok_s else ""
    out = (
        f"The model thought before it answered: {w.count(p.thinking_tokens)} of its {w.count(total)} output tokens were "
        f"thinking, written{cost}{rate}; thinking tokens cost decode time like any other."
    )
    if p.ttft_s is not None and p.ttfa_s is not None:
        out += (
            f" The first token came after {w.secs(p.ttft_s)}, the first answer token after {w.secs(p.ttfa_s)}: "
            f"the answer came {w.secs(p.ttfa_s - p.ttft_s)} later than the first token says."
        )
    elif p.ttft_s is not None:
        out += f" The first token came after {w.secs(p.ttft_s)}; no answer token followed the thinking."
    return out


def explain_request(
    record: RequestRecord,
    phases: Phases,
    *,
    ceilings: Ceilings | None = None,
    diagnoses: Sequence[Diagnosis] = (),
) -> list[str]:
    """Where this request's time went, what its thinking cost (a thinking reply), then how it compares with the
    hardware (or, when something held it back, the most important diagnosis)."""
    out = [_where_time_went(record, phases)]
    thought = explain_thinking(phases)
    if thought is not None:
        out.append(thought)
    warning = next((d for d in diagnoses if d.severity is Severity.WARNING), None)
    if warning is not None:
        out.append(warning.sentence)
    elif ceilings is not None and (phases.decode_tok_s or phases.prefill_tok_s):
        bits = []
        if phases.decode_tok_s:
            bits.append(
                f"decode reached {w.pct(phases.decode_tok_s / ceilings.decode_ceiling_tok_s)} of the "
                f"{w.tok_s(ceilings.decode_ceiling_tok_s)} that {w.gb_s(ceilings.bandwidth_bytes_s)} allows for this model "
                f"at {w.count(ceilings.context_tokens)} tokens of context"
            )
        if phases.prefill_tok_s and not phases.cached_tokens:
            bound = "compute" if ceilings.prefill_intensity_flop_per_byte >= ceilings.ridge_point_flop_per_byte else "memory"
            bits.append(
                f"prefill {w.pct(phases.prefill_tok_s / ceilings.prefill_ceiling_tok_s)} of its "
                f"{w.tok_s(ceilings.prefill_ceiling_tok_s)} ceiling at {w.count(ceilings.prompt_tokens)} prompt tokens "
                f"(bound by {bound})"
            )
        if bits:
            s = "; ".join(bits)
            out.append(s[0].upper() + s[1:] + ".")
    elif diagnoses:
        out.append(diagnoses[0].sentence)
    return out


def _of(n: int) -> str:
    return "one request" if n == 1 else f"median of {w.count(n)} requests"


def _the(name: str) -> str:
    """ "the RTX 4090", but "this computer's CPU" as it is."""
    return name if name.lower().startswith(("this ", "the ", "a ", "an ")) else "the " + name


def _verdicts(c: Ceilings, hardware_name: str) -> str:
    """Which side of the ridge each phase sits on, from the numbers (never fixed text)."""
    ridge, dec, pre = c.ridge_point_flop_per_byte, c.decode_intensity_flop_per_byte, c.prefill_intensity_flop_per_byte
    if dec < ridge:
        dec_side = f"decode runs {w.times(ridge / dec)} below it, waiting on memory"
    else:
        dec_side = f"decode sits {w.times(dec / ridge)} above it, limited by compute"
    if pre >= ridge:
        pre_side = f"a {w.count(c.prompt_tokens)}-token prefill sits {w.times(pre / ridge)} above it, limited by compute"
    else:
        pre_side = (
            f"a {w.count(c.prompt_tokens)}-token prefill sits {w.times(ridge / pre)} below it too, waiting on memory: "
            f"each read of the weights serves only {w.count(max(1, min(c.prompt_tokens, c.ubatch_tokens)))} tokens"
        )
    return (
        f"Per byte fetched from memory, decode does about {w.num(dec)} FLOP and a {w.count(c.prompt_tokens)}-token prefill "
        f"about {w.num(pre)}; {_the(hardware_name)} needs {w.num(ridge)} FLOP per byte to keep its arithmetic busy "
        f"(its ridge point), so {dec_side}, while {pre_side}."
    )


def held_out_words(story: Story, kind: str) -> str:
    """The calibrated model's measured error on readings it was not fitted on, or why there is none yet."""
    h = story.held_out_error(kind)
    if h is None:
        return "no error measured yet: too few readings came before the newest ones to predict them"
    n = "one request" if h.readings == 1 else f"{w.count(h.readings)} requests"
    return (
        f"off by a median of {w.pct(h.median_abs_error)} (at most {w.pct(h.max_abs_error)}) on {n}, "
        "each predicted from those before it"
    )


def calibrated_sentence(story: Story) -> str:
    """What the model fitted on the user's readings expects, kept apart from the prior and the measurement."""
    eff = story.model.efficiencies
    fitted = eff.prefill_samples or eff.decode_samples
    if not fitted:
        return (
            f"No model is calibrated on your readings yet: it takes {MIN_CALIBRATION_SAMPLES} readings of a kind timed over "
            f"{MIN_RATE_TOKENS} tokens or more; until then the expected lines are the prior's."
        )
    return (
        f"Calibrated on your readings, the model expects {w.tok_s(story.expected_prefill_tok_s)} and "
        f"{w.tok_s(story.expected_decode_tok_s)}; prefill {held_out_words(story, 'prefill')}, decode "
        f"{held_out_words(story, 'decode')}. What-if and the waits use it."
    )


def _yours(hardware_name: str) -> str:
    """ "your NVIDIA H200", but "this computer's CPU" as it is (never "your this computer's CPU")."""
    return hardware_name if hardware_name.startswith(("this ", "your ")) else f"your {hardware_name}"


def explain_rates(
    story: Story,
    *,
    hardware_name: str,
    model_name: str,
    ubatch_source: str = "llama.cpp's default",
    interference: Sequence[Interference] = (),
    thinking: str | None = None,
) -> list[str]:
    """Why prefill is so much faster than decode on this GPU and model, in its numbers.

    ``thinking`` (``explain_thinking_replies``) follows the decode sentence: thinking is decode work.

    Every ceiling and expectation comes from ``story.model`` and names the prompt length or context it
    is for; the headline sets the measured medians beside the expected rates at the same prompt lengths
    and contexts, and says why when they differ beyond ``RATIO_SPREAD``.
    """
    c = story.ceilings
    m = story.model
    p, ctx = story.typical_prompt_tokens, story.typical_context_tokens
    pp, tg = story.prefill_median_tok_s, story.decode_median_tok_s
    out: list[str] = []

    ratio = story.measured_ratio
    if ratio is not None and pp is not None and tg is not None:
        pre_n, dec_n = story.counted("prefill"), story.counted("decode")
        lo, hi = min(r.tokens for r in pre_n), max(r.tokens for r in pre_n)
        span = f"{w.count(lo)} prompt tokens" if lo == hi else f"{w.count(lo)} to {w.count(hi)} prompt tokens"
        prior_pp, prior_tg = (
            story.prior_prefill_tok_s or story.expected_prefill_tok_s,
            story.prior_decode_tok_s or story.expected_decode_tok_s,
        )
        out.append(
            f"On {_yours(hardware_name)}, {model_name} read prompts at {w.tok_s(pp)} ({_of(len(pre_n))}, {span}) and wrote "
            f"its replies at {w.tok_s(tg)} ({_of(len(dec_n))}): prefill ran {w.times(ratio)} faster than decode. For the "
            f"same prompt lengths and contexts, first principles and the hardware table (before any reading) expect about "
            f"{w.tok_s(prior_pp)} and {w.tok_s(prior_tg)}, {w.times(prior_pp / prior_tg)}."
        )
        out.append(calibrated_sentence(story))
        if story.ratios_differ:
            pre_frac, dec_frac = pp / prior_pp, tg / prior_tg
            worse = "prefill" if abs(pre_frac - 1) >= abs(dec_frac - 1) else "decode"
            out.append(
                f"The two ratios differ by more than {w.times(RATIO_SPREAD)}: prefill ran at {w.pct(pre_frac)} of its expected "
                f"rate and decode at {w.pct(dec_frac)}, so {worse} is the one to look into (what held requests back, below)."
            )
    else:
        out.append(
            f"On {hardware_name}, {model_name} should read a {w.count(p)}-token prompt at about "
            f"{w.tok_s(c.prefill_expected_tok_s)} and write at about {w.tok_s(c.decode_expected_tok_s)} with "
            f"{w.count(ctx)} tokens of context: prefill about {w.times(c.expected_ratio)} faster than decode."
        )

    kv_bytes = c.kv_bytes_per_tok * c.context_tokens
    out.append(
        f"Decode makes one token at a time, and each token must stream all {w.gb(c.weights_bytes)} of weights"
        + (f" plus {w.gb(kv_bytes)} of KV cache" if kv_bytes > 0 else "")
        + f" from memory at {w.count(ctx)} tokens of context: at {w.gb_s(c.bandwidth_bytes_s)} that allows at most "
        f"{w.tok_s(c.decode_ceiling_tok_s)} there, and about {w.tok_s(c.decode_expected_tok_s)} is typical "
        + (
            f"({w.pct(c.efficiencies.eta_bw)} of it), however fast the arithmetic is."
            if c.efficiencies.fixed_s_per_token <= 0
            else f"({w.pct(c.decode_expected_tok_s / c.decode_ceiling_tok_s)} of it): the bytes at "
            f"{w.pct(c.efficiencies.eta_bw)} of that bandwidth, plus {w.secs(c.efficiencies.fixed_s_per_token)} per token that "
            "does not depend on them (kernel launches per layer, the output head, sampling; "
            f"{c.efficiencies.source_fixed})."
        )
    )
    if thinking is not None:
        out.append(thinking)

    per_read = max(1, min(p, c.ubatch_tokens))
    compute_ceiling = c.peak_flops / c.prefill_flops_per_token
    memory_ceiling = c.bandwidth_bytes_s * per_read / c.weights_bytes
    bound = "compute" if compute_ceiling <= memory_ceiling else "memory"
    out.append(
        f"Prefill is matrix work on many prompt tokens at once: a {w.count(p)}-token prompt is read in micro-batches of up to "
        f"{w.count(c.ubatch_tokens)} tokens ({ubatch_source}), each reading the weights once, and each token costs about "
        f"{c.prefill_flops_per_token / 1e9:.1f} GFLOP; {w.tflops(c.peak_flops)} of compute allows {w.tok_s(compute_ceiling)} "
        f"and {w.gb_s(c.bandwidth_bytes_s)} allows {w.tok_s(memory_ceiling)} with {w.count(per_read)} tokens per read of the "
        f"weights, so at {w.count(p)} prompt tokens the ceiling is {w.tok_s(c.prefill_ceiling_tok_s)}, set by {bound} "
        f"({w.tok_s(c.prefill_expected_tok_s)} typical)."
    )

    out.append(_verdicts(c, hardware_name))

    token_ms = 1000 / c.decode_expected_tok_s
    longer = min(p * 8, m.facts.context_length or p * 8)
    long_c = m.at(longer, longer)
    example = (
        f"So time to first token grows with the prompt: {w.count(p)} prompt tokens at the {w.tok_s(c.prefill_expected_tok_s)} "
        f"expected for that length take {w.secs(p / c.prefill_expected_tok_s)}"
    )
    if longer > p:
        example += (
            f", {w.count(longer)} at {w.tok_s(long_c.prefill_expected_tok_s)} take "
            f"{w.secs(longer / long_c.prefill_expected_tok_s)}"
        )
    out.append(
        example + f" (plus loading, if the model was not in memory, and any wait for a slot), while every token after the "
        f"first takes about {w.secs(token_ms / 1000)}."
    )

    agg, per = c.batched_decode_tok_s(BATCH_EXAMPLE_STREAMS)
    out.append(
        f"Several users at once share each pass over the weights: with {BATCH_EXAMPLE_STREAMS} replies decoding together at "
        f"{w.count(ctx)} tokens of context each, a "
        f"step reads {w.gb(c.weights_bytes + BATCH_EXAMPLE_STREAMS * kv_bytes)} instead of {w.gb(c.decode_bytes_per_token)}, "
        f"so together they could reach about {w.tok_s(agg)} while each sees about {w.tok_s(per)} "
        f"(alone: {w.tok_s(c.decode_expected_tok_s)})."
    )

    ub = c.ubatch_tokens
    chunk = m.at(ub, ub)
    chunk_s = ub / chunk.prefill_expected_tok_s
    out.append(
        f"When another user's long prompt arrives, the server reads it in chunks of up to {w.count(ub)} tokens in "
        f"the same steps as everyone's next token; a {w.count(ub)}-token chunk takes about {w.secs(chunk_s)} here "
        f"(at {w.tok_s(chunk.prefill_expected_tok_s)}), so the others' next token waits that long instead of "
        f"{w.secs(token_ms / 1000)}."
    )
    significant = [i for i in interference if i.significant]
    if significant:
        worst = max(significant, key=lambda i: i.extra_ms_total)
        text = describe(worst, "one reply", "another request")
        out.append("Measured here: " + text[0].lower() + text[1:])
    return out


def explain_energy(e: PhaseEnergy) -> str | None:
    """Joules per prompt token against joules per output token, or None when either is unknown."""
    if e.j_per_prompt_token is None or e.j_per_output_token is None or e.j_per_prompt_token <= 0:
        return None
    how = "the GPU's energy counter" if e.method == "energy_counter" else "its power readings"
    rough = " (a rough figure: the phases were shorter than the time between readings)" if e.coarse else ""
    return (
        f"By {how}, reading the prompt cost {w.num(e.j_per_prompt_token)} J per token and writing the reply "
        f"{w.num(e.j_per_output_token)} J per token, {w.times(e.j_per_output_token / e.j_per_prompt_token)} more: "
        f"a prompt token shares one pass over the weights with its whole batch, an output token pays for a pass alone{rough}."
    )


def explain_embeddings(es: EmbedStory) -> str:
    """Embedding throughput as prefill-only work, against the prefill ceiling at the embeddings' own prompt length."""
    n = len(es.readings)
    c = es.ceilings
    head = (
        f"{w.count(n)} embedding request{'' if n == 1 else 's'} (diamonds on the prefill chart) are prefill-only work: "
        "the inputs' tokens are read and nothing is decoded, so their rate is prompt tokens ÷ prefill time."
    )
    if es.median_tok_s is None:
        return head + f" None was long enough to time well (at least {MIN_RATE_TOKENS} tokens) or below its ceiling."
    bound = "compute" if c.prefill_intensity_flop_per_byte >= c.ridge_point_flop_per_byte else "memory"
    return head + (
        f" At {w.count(es.typical_prompt_tokens)} prompt tokens (their median) they ran at {w.tok_s(es.median_tok_s)} "
        f"({_of(len(es.counted))}), {w.pct(es.median_tok_s / c.prefill_ceiling_tok_s)} of the "
        f"{w.tok_s(c.prefill_ceiling_tok_s)} prefill ceiling there (bound by {bound}; expected "
        f"{w.tok_s(c.prefill_expected_tok_s)}). They are kept out of the generations' medians and calibration"
        + "".join(f"; {w.count(k)} {why} not counted" for k, why in _set_apart(es.readings))
        + "."
    )


def _set_apart(readings: Sequence[Reading]) -> list[tuple[int, str]]:
    """How many readings were set apart, and why, for a sentence."""
    tiny = sum(1 for r in readings if r.status is Status.TINY)
    impossible = sum(1 for r in readings if r.status is Status.IMPOSSIBLE)
    out = []
    if tiny:
        out.append((tiny, f"timed over fewer than {MIN_RATE_TOKENS} tokens {'is' if tiny == 1 else 'are'}"))
    if impossible:
        out.append((impossible, f"above the ceiling (cannot be true) {'is' if impossible == 1 else 'are'}"))
    return out


@dataclass(frozen=True)
class ThinkingReply:
    """One recorded reply that thought before answering (its numbers as stored; None = not known)."""

    thinking_tokens: int
    output_tokens: int | None
    thinking_s: float | None
    ttft_s: float | None
    ttfa_s: float | None


def explain_thinking_replies(replies: Sequence[ThinkingReply], replies_total: int, c: Ceilings, model_name: str) -> str | None:
    """The Why explanation's word on thinking: it is decode work, timed at the decode rate expected here; the first
    token against the first answer token (medians of the replies that thought). None where none thought."""
    if not replies:
        return None
    thinking = statistics.median(r.thinking_tokens for r in replies)
    shares = [r.thinking_tokens / r.output_tokens for r in replies if r.output_tokens]
    share = f" ({w.pct(statistics.median(shares))} of their output)" if shares else ""
    expected_s = thinking / c.decode_expected_tok_s
    out = (
        f"{w.count(len(replies))} of {w.count(replies_total)} {model_name} replies thought before answering, a median "
        f"{w.count(thinking)} thinking tokens{share}. Thinking tokens cost decode time like any other: at the "
        f"{w.tok_s(c.decode_expected_tok_s)} expected for decode at {w.count(c.context_tokens)} tokens of context they take "
        f"about {w.secs(expected_s)}"
    )
    measured = [r.thinking_s for r in replies if r.thinking_s is not None]
    out += f" (measured: {w.secs(statistics.median(measured))}, median)." if measured else "."
    both = [(r.ttft_s, r.ttfa_s) for r in replies if r.ttft_s is not None and r.ttfa_s is not None]
    if both:
        ttft = statistics.median(a for a, _ in both)
        ttfa = statistics.median(b for _, b in both)
        out += (
            f" So the first token came after {w.secs(ttft)} but the first answer token, what the person waits for, "
            f"after {w.secs(ttfa)} (medians of {w.count(len(both))})."
        )
    return out
