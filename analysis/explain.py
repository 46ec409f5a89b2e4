"""Plain words, built from the user's numbers: where a request's time went, and why prefill ≫ decode.

Every sentence is assembled from the figures passed in (the request's phases, the
ceilings for this GPU and model, measured interference); nothing here is a
canned paragraph. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis import wording as w
from analysis.ceilings import Ceilings
from analysis.diagnose import Diagnosis, Severity
from analysis.energy import PhaseEnergy
from analysis.interference import Interference, describe
from analysis.phases import Phases
from analysis.records import RequestRecord

# Parts of a request shorter than this share of it are left out of the sentence.
MIN_PART_SHARE = 0.02
BATCH_EXAMPLE_STREAMS = 4


def _where_time_went(record: RequestRecord, p: Phases) -> str:
    total = p.total_s if p.total_s is not None else p.client_s
    if total is None or total <= 0 or (p.load_s is None and p.prefill_s is None and p.decode_s is None):
        seen = f"{p.token_chunks} token chunks" if p.token_chunks else "no tokens"
        took = f" in {w.secs(p.client_s)}" if p.client_s is not None else ""
        return f"This request ({record.outcome.value}) carries no timing from Ollama; the proxy saw {seen}{took}."
    parts: list[str] = []
    if p.load_s and p.load_s >= MIN_PART_SHARE * total:
        parts.append(f"{w.secs(p.load_s)} loading {record.model}")
    if p.queue_s and p.queue_s >= MIN_PART_SHARE * total:
        parts.append(f"{w.secs(p.queue_s)} waiting for a slot")
    if p.prefill_s and p.prefill_s >= MIN_PART_SHARE * total:
        computed = (p.prompt_tokens or 0) - (p.cached_tokens or 0)
        rate = f" at {w.tok_s(p.prefill_tok_s)}" if p.prefill_tok_s else ""
        cached = f" ({w.count(p.cached_tokens)} more came from the cache)" if p.cached_tokens else ""
        parts.append(f"{w.secs(p.prefill_s)} reading {w.count(computed)} prompt tokens{rate}{cached}")
    if p.decode_s and p.decode_s >= MIN_PART_SHARE * total:
        rate = f" at {w.tok_s(p.decode_tok_s)}" if p.decode_tok_s else ""
        parts.append(f"{w.secs(p.decode_s)} writing {w.count(p.output_tokens or 0)} tokens{rate}")
    if not parts:
        return f"The whole request took {w.secs(total)}."
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"Of {w.secs(total)}, {listed}."


def explain_request(
    record: RequestRecord,
    phases: Phases,
    *,
    ceilings: Ceilings | None = None,
    diagnoses: Sequence[Diagnosis] = (),
) -> list[str]:
    """One or two sentences: where this request's time went, then how it compares with the hardware
    (or, when something held it back, the most important diagnosis)."""
    out = [_where_time_went(record, phases)]
    warning = next((d for d in diagnoses if d.severity is Severity.WARNING), None)
    if warning is not None:
        out.append(warning.sentence)
    elif ceilings is not None and (phases.decode_tok_s or phases.prefill_tok_s):
        bits = []
        if phases.decode_tok_s:
            bits.append(
                f"decode reached {w.pct(phases.decode_tok_s / ceilings.decode_ceiling_tok_s)} of the "
                f"{w.tok_s(ceilings.decode_ceiling_tok_s)} that {w.gb_s(ceilings.bandwidth_bytes_s)} allows for this model"
            )
        if phases.prefill_tok_s and not phases.cached_tokens:
            bits.append(
                f"prefill {w.pct(phases.prefill_tok_s / ceilings.prefill_ceiling_tok_s)} of its "
                f"{w.tok_s(ceilings.prefill_ceiling_tok_s)} compute ceiling"
            )
        if bits:
            s = "; ".join(bits)
            out.append(s[0].upper() + s[1:] + ".")
    elif diagnoses:
        out.append(diagnoses[0].sentence)
    return out


def explain_rates(
    ceilings: Ceilings,
    *,
    hardware_name: str,
    model_name: str,
    prefill_tok_s: float | None = None,
    decode_tok_s: float | None = None,
    prompt_tokens: int | None = None,
    interference: Sequence[Interference] = (),
) -> list[str]:
    """Why prefill is so much faster than decode on this GPU and model, in its numbers.

    ``prefill_tok_s`` / ``decode_tok_s`` are the user's measured (e.g. median) rates; without
    them the expected rates stand in. ``prompt_tokens`` is a typical prompt length for the
    time-to-first-token sentence (default: the one the ceilings were computed for).
    """
    c = ceilings
    pp = prefill_tok_s or c.prefill_expected_tok_s
    tg = decode_tok_s or c.decode_expected_tok_s
    measured = prefill_tok_s is not None and decode_tok_s is not None
    out: list[str] = []

    if measured:
        out.append(
            f"On your {hardware_name}, {model_name} read prompts at {w.tok_s(pp)} and wrote its replies at {w.tok_s(tg)}: "
            f"prefill ran {w.times(pp / tg)} faster than decode."
        )
    else:
        out.append(
            f"On {hardware_name}, {model_name} should read prompts at about {w.tok_s(pp)} and write at about {w.tok_s(tg)}: "
            f"prefill about {w.times(pp / tg)} faster than decode."
        )

    kv_bytes = c.kv_bytes_per_tok * c.context_tokens
    out.append(
        f"Decode makes one token at a time, and each token must stream all {w.gb(c.weights_bytes)} of weights"
        + (f" plus {w.gb(kv_bytes)} of KV cache ({w.count(c.context_tokens)} tokens of context)" if kv_bytes > 0 else "")
        + f" from memory: at {w.gb_s(c.bandwidth_bytes_s)} that allows at most {w.tok_s(c.decode_ceiling_tok_s)}, and about "
        f"{w.tok_s(c.decode_expected_tok_s)} is typical ({w.pct(c.efficiencies.eta_bw)} of it), however fast the arithmetic is."
    )

    out.append(
        f"Prefill is matrix work on many prompt tokens at once: the weights are read once for up to {w.count(c.ubatch_tokens)} "
        f"tokens, and each token costs about {c.prefill_flops_per_token / 1e9:.1f} GFLOP, so {w.tflops(c.peak_flops)} of compute "
        f"allows up to {w.tok_s(c.prefill_ceiling_tok_s)} ({w.tok_s(c.prefill_expected_tok_s)} typical)."
    )

    below = c.ridge_point_flop_per_byte / c.decode_intensity_flop_per_byte
    out.append(
        f"Per byte fetched from memory, decode does about {w.num(c.decode_intensity_flop_per_byte)} FLOP and prefill about "
        f"{w.num(c.prefill_intensity_flop_per_byte)}; the {hardware_name} needs "
        f"{w.num(c.ridge_point_flop_per_byte)} FLOP per byte to keep its arithmetic busy (its ridge point), "
        f"so decode runs {w.times(below)} below it, waiting on memory, while prefill sits above it, limited by compute."
    )

    p = prompt_tokens or c.prompt_tokens
    if p:
        out.append(
            f"So time to first token grows with the prompt: {w.count(p)} prompt tokens at {w.tok_s(pp)} take "
            f"{w.secs(p / pp)} (plus loading, if the model was not in memory, and any wait for a slot), while every "
            f"token after the first takes about {w.ms(1000 / tg)}."
        )

    agg, per = c.batched_decode_tok_s(BATCH_EXAMPLE_STREAMS)
    out.append(
        f"Several users at once share each pass over the weights: with {BATCH_EXAMPLE_STREAMS} replies decoding together a "
        f"step reads {w.gb(c.weights_bytes + BATCH_EXAMPLE_STREAMS * kv_bytes)} instead of {w.gb(c.decode_bytes_per_token)}, "
        f"so together they could reach about {w.tok_s(agg)} while each sees about {w.tok_s(per)} "
        f"(alone: {w.tok_s(c.decode_expected_tok_s)})."
    )

    chunk_s = c.ubatch_tokens / pp
    out.append(
        f"When another user's long prompt arrives, the server reads it in chunks of up to {w.count(c.ubatch_tokens)} tokens in "
        f"the same steps as everyone's next token; each chunk takes about {w.secs(chunk_s)} here, so the others' next "
        f"token waits that long instead of {w.ms(1000 / tg)}."
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
