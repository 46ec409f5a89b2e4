"""A runner that answers /slots badly, run as a child named ``llama-server`` (standard library only).

    llama-server slots_server.py --port N --model PATH --mode 404|501|garbage|html|exit|closed|good|many|nested|redirect

``exit`` answers one good /slots (a prompt being read) and then exits, like a runner that dies mid-request.
``good`` always answers that reading. Hostile ones (issue 29), from whatever answers on a runner's port:
``many`` lists ``MANY_SLOTS`` busy slots with new task ids on every answer, ``nested`` is JSON nested far
deeper than a parser goes, ``redirect`` answers 302 to ``--location``.
The process is started through a symlink named ``llama-server`` so discovery finds it as it finds the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD = [
    {
        "id": 0,
        "n_ctx": 4096,
        "speculative": False,
        "is_processing": True,
        "id_task": 0,
        "n_prompt_tokens": 1024,
        "n_prompt_tokens_processed": 512,
        "n_prompt_tokens_cache": 0,
        "params": {"n_predict": 16},
        "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": 16, "n_decoded": 0}],
        "prompt": "SECRET PROMPT TEXT",
        "generated": "",
    }
]
MANY_SLOTS = 20_000
NESTING = 100_000


def many_slots(first_task: int) -> bytes:
    """``MANY_SLOTS`` busy slots, each reading a prompt (counts only, as llama-server lists them)."""
    return json.dumps(
        [
            {
                "id": i,
                "n_ctx": 4096,
                "is_processing": True,
                "id_task": first_task + i,
                "n_prompt_tokens": 1024,
                "n_prompt_tokens_processed": 512,
                "n_prompt_tokens_cache": 0,
                "next_token": [{"n_decoded": 3}],
            }
            for i in range(MANY_SLOTS)
        ]
    ).encode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mode", required=True)
    p.add_argument("--location", default="")
    p.add_argument("-np", type=int, default=None)  # as llama-server takes it (discovery reads it)
    args = p.parse_args()
    answers = [0]  # how many /slots answers so far: ``many`` gives new task ids each time

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b'{"status":"ok"}')
            elif args.mode in ("404", "501"):
                self._send(int(args.mode), b'{"error":{"code":%s,"message":"no"}}' % args.mode.encode())
            elif args.mode == "garbage":
                self._send(200, b'{"id": 0, "is_processing": tr')
            elif args.mode == "html":
                self._send(200, b"<html>hello</html>", "text/html")
            elif args.mode == "exit":
                self._send(200, json.dumps(GOOD).encode())
                threading.Timer(0.05, os._exit, (0,)).start()
            elif args.mode == "good":
                self._send(200, json.dumps(GOOD).encode())
            elif args.mode == "many":
                answers[0] += 1
                self._send(200, many_slots(answers[0] * MANY_SLOTS))
            elif args.mode == "nested":
                self._send(200, b"[" * NESTING + b"]" * NESTING)
            elif args.mode == "redirect":
                self.send_response(302)
                self.send_header("Location", args.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    if args.mode == "closed":  # a runner whose port nobody listens on
        threading.Event().wait()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
