"""``python -m analysis.roofline_cli``: decode and prefill ceilings, and the rates to expect, for one GPU and one model.

The command line lives apart from ``analysis.roofline`` (the formulas) because it needs
``analysis.ceilings``, which itself imports the formulas.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from analysis.ceilings import compute_ceilings, ollama_num_batch, starting_efficiencies
from analysis.command_line import ExitCode
from analysis.hardware import close_matches, resolve_spec
from analysis.roofline import kv_bytes_per_token, speculative_decode_ceiling_tok_s
from analysis.speculative import MAX_MEAN_LEN


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.roofline_cli",
        description="Decode and prefill ceilings, and the rates to expect, for one GPU and one model.",
    )
    p.add_argument("--gpu", help="GPU name as NVML/the OS reports it (e.g. 'NVIDIA GeForce RTX 4090') or a table key")
    p.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth in GB/s (overrides the table)")
    p.add_argument("--tflops", type=float, help="dense FP16 compute in TFLOP/s (overrides the table)")
    p.add_argument("--weights-bytes", type=float, required=True, help="bytes of weights read per token (GGUF size)")
    p.add_argument("--params", type=float, required=True, help="parameters used per token")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True, help="embedding length d")
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--context", type=int, default=0, help="context tokens a decode step attends over")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length for prefill")
    p.add_argument(
        "--num-batch", type=int, default=None, help="micro-batch the runner uses (default: Ollama's for --num-ctx, else 512)"
    )
    p.add_argument("--num-ctx", type=int, default=None, help="context the model is loaded with (picks Ollama's num_batch)")
    p.add_argument("--quant", default=None, help="quantization, e.g. Q4_K_M or F16 (picks the decode efficiency)")
    p.add_argument("--vram-fraction", type=float, default=1.0, help="size_vram / size when partly offloaded")
    p.add_argument("--host-bandwidth-gbs", type=float, help="system memory bandwidth for the offloaded part")
    p.add_argument("--eta-bw", type=float, help="decode efficiency (fraction of the bandwidth ceiling)")
    p.add_argument("--eta-compute", type=float, help="prefill efficiency (fraction of the compute ceiling)")
    p.add_argument(
        "--tokens-per-step",
        type=float,
        default=None,
        help="speculative decoding: tokens one read of the weights yields on average (the runner's 'mean len'; "
        "1 + --spec-draft-n-max at most)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _draft_ceiling(parser: argparse.ArgumentParser, tokens_per_step: float | None, plain_tok_s: float) -> float | None:
    """The decode ceiling with a draft yielding ``tokens_per_step`` tokens a step; None without one."""
    if tokens_per_step is None:
        return None
    if not 1.0 <= tokens_per_step <= MAX_MEAN_LEN:
        parser.error(f"--tokens-per-step must be from 1 to {MAX_MEAN_LEN:.0f}")
    return speculative_decode_ceiling_tok_s(plain_tok_s, tokens_per_step)


def _print_draft_ceiling(ceiling_tok_s: float | None, tokens_per_step: float | None) -> None:
    if ceiling_tok_s is not None and tokens_per_step is not None:
        print(f"decode with a draft: ceiling {ceiling_tok_s:8.1f} tok/s at {tokens_per_step:.2f} tokens a step")


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    spec = None
    if args.gpu:
        spec = resolve_spec(args.gpu)
        if spec is None and (args.bandwidth_gbs is None or args.tflops is None):
            near = close_matches(args.gpu)
            hint = f"; close matches: {', '.join(near)}" if near else "; no close matches in the table"
            print(
                f"error: unknown GPU {args.gpu!r}{hint}. Give --bandwidth-gbs and --tflops to use your own numbers.",
                file=sys.stderr,
            )
            return ExitCode.USAGE
    elif args.bandwidth_gbs is None or args.tflops is None:
        parser.error("give --gpu, or both --bandwidth-gbs and --tflops")
    bandwidth = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs is not None else spec.bandwidth_bytes_s  # type: ignore[union-attr]
    flops = args.tflops * 1e12 if args.tflops is not None else spec.fp16_flops  # type: ignore[union-attr]
    eff = starting_efficiencies(spec, args.quant)
    if args.eta_bw is not None:
        eff = replace(eff, eta_bw=args.eta_bw, source_bw="given on the command line")
    if args.eta_compute is not None:
        eff = replace(eff, eta_compute=args.eta_compute, source_compute="given on the command line")
    try:
        c = compute_ceilings(
            bandwidth_bytes_s=bandwidth,
            peak_flops=flops,
            weights_bytes=args.weights_bytes,
            params=args.params,
            layers=args.layers,
            hidden=args.hidden,
            kv_bytes_per_tok=kv_bytes_per_token(args.layers, args.kv_heads, args.head_dim),
            context_tokens=args.context,
            prompt_tokens=args.prompt_tokens,
            efficiencies=eff,
            vram_fraction=args.vram_fraction,
            host_bandwidth_bytes_s=args.host_bandwidth_gbs * 1e9 if args.host_bandwidth_gbs else None,
            ubatch_tokens=args.num_batch or ollama_num_batch(args.num_ctx),
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    draft_ceiling = _draft_ceiling(parser, args.tokens_per_step, c.decode_ceiling_tok_s)
    out = c.as_dict()
    out["tokens_per_step"] = args.tokens_per_step
    out["speculative_decode_ceiling_tok_s"] = draft_ceiling
    out["gpu"] = spec.name if spec else None
    out["gpu_key"] = spec.key if spec else None
    out["quant"] = args.quant
    out["expected_ratio"] = c.expected_ratio
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return ExitCode.OK
    label = spec.name if spec else "given numbers"
    print(
        f"{label}: {c.bandwidth_bytes_s / 1e9:.0f} GB/s, {c.peak_flops / 1e12:.1f} TFLOP/s "
        f"(ridge point {c.ridge_point_flop_per_byte:.0f} FLOP/byte)"
    )
    print(
        f"decode : ceiling {c.decode_ceiling_tok_s:8.1f} tok/s, expected {c.decode_expected_tok_s:8.1f} "
        f"(η {eff.eta_bw:.2f}) at {c.context_tokens} tokens of context"
    )
    _print_draft_ceiling(draft_ceiling, args.tokens_per_step)
    compute_bound = c.prefill_intensity_flop_per_byte >= c.ridge_point_flop_per_byte
    bound = f"compute-bound, η {eff.eta_compute:.2f}" if compute_bound else f"memory-bound, η {eff.eta_bw:.2f}"
    print(
        f"prefill: ceiling {c.prefill_ceiling_tok_s:8.1f} tok/s, expected {c.prefill_expected_tok_s:8.1f} "
        f"({bound}) for a {c.prompt_tokens}-token prompt, micro-batch {c.ubatch_tokens}"
    )
    print(f"expected prefill/decode ratio: {c.expected_ratio:.0f}× (at these prompt and context lengths)")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
