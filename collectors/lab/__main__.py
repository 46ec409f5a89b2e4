"""``python -m collectors.lab EXPERIMENT --ollama URL --model NAME [options] [--json]``

Runs one experiment and prints its result (with ``--json``: one JSON object with
name, parameters, points, summary and conclusion). ``--out FILE`` (or ``--data
DIR``, which writes ``DIR/lab/<run_id>.json``) keeps the document up to date
after every point, which is how the Lab page follows a run. SIGTERM or Ctrl-C
cancels: open streams are closed at once and the partial result is kept.

Exit codes: 0 done, 1 failed or timed out, 2 bad arguments / Ollama unreachable /
unknown model, 130 cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from analysis.command_line import ExitCode
from analysis.model_names import same_model
from collectors.lab.client import LabClient, LabError, normalize_url
from collectors.lab.context import DEFAULT_CONTEXT_TOKENS
from collectors.lab.experiments import EXPERIMENTS, make_params
from collectors.lab.results import CANCELLED, DONE, FAILED, TIMED_OUT, ExperimentResult, lab_dir, write_result
from collectors.lab.runner import DEFAULT_TIMEOUT_S, preflight, run_experiment
from collectors.stopping import on_stop_signals

# The exit codes every command shares (analysis/command_line.py).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE, ExitCode.CANCELLED
_TYPES: dict[str, type] = {"int": int, "float": float}


def _param_fields() -> dict[str, tuple[type, str, list[str]]]:
    """Every experiment parameter: its type, help, and which experiments have it."""
    found: dict[str, list[tuple[str, dataclasses.Field[Any]]]] = {}
    for spec in EXPERIMENTS.values():
        for f in dataclasses.fields(spec.params_cls):
            found.setdefault(f.name, []).append((spec.name, f))
    out: dict[str, tuple[type, str, list[str]]] = {}
    for name, uses in found.items():
        first = uses[0][1]
        defaults = {str(f.default) for _, f in uses}
        if len(defaults) == 1:
            default = f"default {first.default}"
        else:
            default = "default " + ", ".join(f"{exp} {f.default}" for exp, f in uses)
        out[name] = (_TYPES[str(first.type)], f"{first.metadata.get('help', '')} ({default})", [exp for exp, _ in uses])
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m collectors.lab",
        description="Run one Lab experiment against Ollama (normally through the recording proxy).",
        epilog="Experiments: " + "; ".join(f"{s.name}: {s.question}" for s in EXPERIMENTS.values()),
    )
    ap.add_argument("experiment", choices=sorted(EXPERIMENTS))
    ap.add_argument(
        "--ollama",
        default=os.environ.get("OLLAMA_HOST", ""),
        help="Ollama or proxy address, by OLLAMA_HOST's rules (default $OLLAMA_HOST, else 127.0.0.1:11434)",
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument("--out", type=Path, help="keep the result document in this file, updated after every point")
    ap.add_argument("--data", type=Path, help="data folder: write the document to DATA/lab/<run_id>.json")
    ap.add_argument("--run-id", help="id of the run (default: random)")
    ap.add_argument("--dry-run", action="store_true", help="print what the run would send, and send nothing")
    ap.add_argument("--num-ctx", type=int, help="context per request (default: what the loaded model has)")
    ap.add_argument("--seed", type=int, help="seed of the random prompts")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="time limit for the whole run, seconds")
    group = ap.add_argument_group("experiment parameters")
    for name, (typ, help_text, users) in _param_fields().items():
        group.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=f"{help_text}; {', '.join(users)}")
    return ap


class ProgressBar:
    """A one-line bar on a terminal's stderr; silent when stderr is not a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()

    def __call__(self, r: ExperimentResult) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * r.progress.fraction)
        total = r.progress.total or "?"
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {r.progress.done}/{total} {r.progress.message[:50]:<50}"
        self.stream.write(line)
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _error(msg: str) -> int:
    print(f"collectors.lab: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


async def _dry_run(args: argparse.Namespace, params: dict[str, Any]) -> dict[str, Any]:
    async with LabClient(args.ollama) as client:
        _, facts = await preflight(client, args.model)
        ctx = args.num_ctx
        if ctx is None:
            loaded = [m for m in await client.ps() if same_model(str(m.get("name")), args.model)]
            ctx = (loaded[0].get("context_length") if loaded else None) or DEFAULT_CONTEXT_TOKENS
    spec = EXPERIMENTS[args.experiment]
    cost = spec.cost(make_params(args.experiment, params), ctx)
    return {
        "name": args.experiment,
        "model": args.model,
        "context_tokens": ctx,
        "model_facts": facts,
        "cost": cost.to_json_dict(),
    }


async def _run(args: argparse.Namespace, params: dict[str, Any], out: Path | None, bar: ProgressBar) -> ExperimentResult:
    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_stop_signals(loop, cancel.set)

    def on_update(r: ExperimentResult) -> None:
        if out is not None:
            write_result(out, r)
        bar(r)

    return await run_experiment(
        args.experiment,
        args.ollama,
        args.model,
        params,
        num_ctx=args.num_ctx,
        seed=args.seed,
        timeout_s=args.timeout,
        cancel=cancel,
        on_update=on_update,
        run_id=args.run_id,
    )


def _print_human(r: ExperimentResult) -> None:
    print(f"{r.name} on {r.model} at {r.ollama_url}: {r.state}")
    for p in r.points:
        print("  " + "  ".join(f"{k}={_short(v)}" for k, v in p.items()))
    print(r.conclusion)


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _write_failed(out: Path, args: argparse.Namespace, run_id: str, params: dict[str, Any], started: float, error: str) -> None:
    try:
        url = normalize_url(args.ollama)
    except LabError:
        url = args.ollama
    doc = ExperimentResult(
        name=args.experiment,
        run_id=run_id,
        model=args.model,
        ollama_url=url,
        parameters={**params, "num_ctx": args.num_ctx, "seed": args.seed, "timeout_s": args.timeout},
        started_at_unix_s=started,
        state=FAILED,
        conclusion=f"Failed before sending anything: {error}",
        finished_at_unix_s=time.time(),
        error=error,
        pid=os.getpid(),
    )
    write_result(out, doc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fields = _param_fields()
    params = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    try:
        make_params(args.experiment, params)
    except ValueError as exc:
        return _error(str(exc))
    if (args.num_ctx is not None and args.num_ctx <= 0) or args.timeout <= 0:
        return _error("--num-ctx and --timeout must be positive")
    if args.dry_run:
        try:
            plan = asyncio.run(_dry_run(args, params))
        except LabError as exc:
            return _error(str(exc))
        print(json.dumps(plan, indent=None if args.json else 1))
        return EXIT_OK
    run_id = args.run_id or uuid.uuid4().hex[:12]
    args.run_id = run_id
    out: Path | None = args.out or (lab_dir(args.data) / f"{run_id}.json" if args.data else None)
    bar = ProgressBar(sys.stderr)
    started = time.time()
    try:
        result = asyncio.run(_run(args, params, out, bar))
    except LabError as exc:
        bar.finish()
        if out is not None:  # whoever follows the document (the Lab page) learns why nothing ran
            _write_failed(out, args, run_id, params, started, str(exc))
        return _error(str(exc))
    bar.finish()
    if args.json:
        json.dump(result.to_json_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_human(result)
    if result.state == DONE:
        return EXIT_OK
    if result.state == CANCELLED:
        return EXIT_CANCELLED
    if result.state == TIMED_OUT:
        print(f"collectors.lab: {result.error}", file=sys.stderr)
    else:
        print(f"collectors.lab: failed: {result.error}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
