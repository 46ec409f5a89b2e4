"""``python -m collectors.ollama``: the runners of an Ollama (its ``llama-server`` children) and their slots now."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from analysis.command_line import ExitCode
from analysis.printable import printable
from collectors.config import SettingsError, ollama_base_url
from collectors.ollama.runner_slots import read_once


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m collectors.ollama", description="The runners of an Ollama and their slots now (counts only)."
    )
    p.add_argument(
        "--ollama", metavar="URL", default=None, help="Ollama to look at; default $OLLAMA_HOST, else http://127.0.0.1:11434"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    try:
        url = ollama_base_url(args.ollama if args.ollama is not None else os.environ.get("OLLAMA_HOST"))
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.USAGE
    found = read_once(url)
    if args.json:
        print(json.dumps(found, indent=2))
        return ExitCode.OK
    # Names, paths and problems come from Ollama, its runners and their command lines: printed escaped.
    if found["found_by"]:
        print(printable(f"runners of {url} found {found['found_by']}"))
    if found["problem"]:
        print(printable(found["problem"]))
    for r in found["runners"]:
        print(printable(f"pid {r['pid']} port {r['port']} {r['kind']} model {r['model'] or '?'} ({r['model_path']})"))
        if r["problem"]:
            print(f"  {printable(r['problem'])}")
        for s in r["slots"]:
            print(
                f"  slot {s['slot_id']}: processing={s['is_processing']} ctx {s['ctx_tokens']}/{s['n_ctx']} "
                f"prompt read {s['processed_tokens']} cached {s['cached_tokens']} decoded {s['decoded_tokens']}"
            )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
