"""The Python half of scripts/gpu_check.sh (docs/gpu-check.md): write the model, drive generations, compare records.

    python scripts/gpu_check.py vocab --from GGUF --out VOCAB.gguf     Gemma 3's tokenizer alone (a few MB)
    python scripts/gpu_check.py model --vocab GGUF --out MODEL.gguf [--size 12b|4b|27b|tiny] [--type Q4_0|Q8_0]
    python scripts/gpu_check.py drive PROXY_URL DIRECT_URL OUT.json [--lengths 256,1024] [--predict 256] [--num-ctx N]
    python scripts/gpu_check.py compare --data DIR --log OLLAMA.log [--truth DRIVE.json]

``model`` writes a GGUF of a Gemma 3 shape with random weights (speed does not depend on the values) and the real
tokenizer copied from ``--vocab``; every 2-D weight is a view of one shared buffer, so memory stays small.
``drive`` sends generations through the collector's proxy and straight to the Ollama-compatible server, with the
client's own truth per request (time to first token, gaps, Ollama's final counts) in a JSON file; raw HTTP, no SDK.
``compare`` checks the store against the runner's own timings in Ollama's log (each generation recorded once, its
prefill and decode equal to the runner's to the millisecond) and against the client's truth; exit 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the project's packages beside it

# hidden, layers, ffn, heads, kv_heads, head_dim, sliding window, context (Gemma 3's published shapes)
SIZES = {
    "tiny": (640, 4, 2048, 4, 1, 256, 512, 32768),
    "4b": (2560, 34, 10240, 8, 4, 256, 1024, 131072),
    "12b": (3840, 48, 15360, 16, 8, 256, 1024, 131072),
    "27b": (5376, 62, 21504, 32, 16, 128, 1024, 131072),
}
SENTENCE = "The caravan crossed the dry valley at dawn, carrying salt, copper and letters for the northern towns. "
TOKENS_PER_SENTENCE = 20  # with Gemma 3's tokenizer
MS_MATCH = 1.0  # a record's prefill and decode against the runner's printed timings: equal to the millisecond


# -- the model -------------------------------------------------------------------------------------------


def _copy_tokenizer(src: Any, writer: Any) -> None:
    import gguf

    for key, f in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, f.contents())
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_string(key, f.contents())
        elif vtype == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, f.contents())
        else:
            writer.add_uint32(key, int(f.contents()))


def write_vocab(source: Path, out: Path) -> None:
    """Only the tokenizer keys of a Gemma 3 GGUF (the model package's), for a machine without the registries."""
    import gguf

    writer = gguf.GGUFWriter(str(out), "gemma3")
    _copy_tokenizer(gguf.GGUFReader(str(source)), writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def _shapes(size: str, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    h, layers, ffn, nh, nkv, hd, _, _ = SIZES[size]
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h)), ("output_norm.weight", (h,))]
    for i in range(layers):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (h,)),
            (p + "attn_q.weight", (nh * hd, h)),
            (p + "attn_k.weight", (nkv * hd, h)),
            (p + "attn_v.weight", (nkv * hd, h)),
            (p + "attn_q_norm.weight", (hd,)),
            (p + "attn_k_norm.weight", (hd,)),
            (p + "attn_output.weight", (h, nh * hd)),
            (p + "post_attention_norm.weight", (h,)),
            (p + "ffn_norm.weight", (h,)),
            (p + "ffn_gate.weight", (ffn, h)),
            (p + "ffn_up.weight", (ffn, h)),
            (p + "ffn_down.weight", (h, ffn)),
            (p + "post_ffw_norm.weight", (h,)),
        ]
    return shapes


def write_model(vocab_path: Path, out: Path, size: str, qtype_name: str) -> str:
    import gguf
    import numpy as np

    qtypes = {"Q4_0": (gguf.GGMLQuantizationType.Q4_0, 32, 18, 2), "Q8_0": (gguf.GGMLQuantizationType.Q8_0, 32, 34, 7)}
    qtype, block, block_bytes, file_type = qtypes[qtype_name]
    h, layers, ffn, nh, nkv, hd, window, ctx = SIZES[size]
    src = gguf.GGUFReader(str(vocab_path))
    w = gguf.GGUFWriter(str(out), "gemma3")
    w.add_name(f"Gemma 3 {size} shape, random weights")
    w.add_type("model")
    w.add_context_length(ctx)
    w.add_embedding_length(h)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(window)
    w.add_file_type(file_type)
    w.add_quantization_version(2)
    _copy_tokenizer(src, w)
    shapes = _shapes(size, len(src.fields["tokenizer.ggml.tokens"].data))
    biggest = max(s[0] * s[1] // block * block_bytes for _, s in shapes if len(s) == 2)
    buf = np.random.default_rng(0).integers(0, 256, size=biggest, dtype=np.uint8)
    blocks = buf.reshape(-1, block_bytes)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)  # a small scale: finite logits
    if qtype_name == "Q8_0":
        blocks[:, 2:] = (blocks[:, 2:] % 16).astype(np.uint8)
    ones = np.ones(max(h, hd, ffn), dtype=np.float32)
    for name, s in shapes:
        if len(s) == 1:
            w.add_tensor(name, ones[: s[0]])
        else:
            rows, cols = s
            row_bytes = cols // block * block_bytes
            w.add_tensor(name, buf[: rows * row_bytes].reshape(rows, row_bytes), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    params = sum(s[0] * s[1] if len(s) == 2 else s[0] for _, s in shapes)
    return f"wrote {out}: {size} {qtype_name}, {params / 1e9:.2f} B parameters, {out.stat().st_size} bytes"


# -- the traffic ------------------------------------------------------------------------------------------


def prompt(n_tokens: int, tag: str) -> str:
    # a unique head defeats the runner's prompt cache
    story = SENTENCE * max(1, n_tokens // TOKENS_PER_SENTENCE)
    return f"[{tag} {random.random():.12f}] {story}\nSummarise the story above."


def generate(base: str, model: str, text: str, predict: int, num_ctx: int, tag: str, out: list[dict[str, Any]]) -> None:
    """One streamed /api/generate; the client's own times and Ollama's final counts appended to ``out``."""
    options = {"num_predict": predict, "temperature": 0, "num_ctx": num_ctx}
    body = json.dumps({"model": model, "prompt": text, "stream": True, "options": options}).encode()
    req = urllib.request.Request(base + "/api/generate", data=body, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    t0 = time.perf_counter()
    start_unix_s = time.time()
    times: list[float] = []
    final: dict[str, Any] = {}
    with opener.open(req, timeout=900) as resp:
        for raw in resp:
            if not raw.strip():
                continue
            chunk = json.loads(raw)
            if chunk.get("response"):
                times.append(time.perf_counter() - t0)
            if chunk.get("done"):
                final = chunk
    gaps = [b - a for a, b in itertools.pairwise(times)]
    rec: dict[str, Any] = {
        "tag": tag,
        "via": base,
        "start_unix": start_unix_s,
        "ttft_s": times[0] if times else None,
        "total_s": time.perf_counter() - t0,
        "n_chunks": len(times),
        "max_gap_s": max(gaps) if gaps else None,
        "gaps_s": gaps,
    }
    for k in ("prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration", "load_duration", "total_duration"):
        rec[k] = final.get(k)
    out.append(rec)
    print(f"{tag:>14} prompt={rec['prompt_eval_count']} out={rec['eval_count']} ttft={rec['ttft_s']}", flush=True)


def drive(proxy: str, direct: str, out_path: Path, lengths: list[int], predict: int, num_ctx: int) -> None:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(direct + "/api/tags", timeout=30) as resp:
        model = json.loads(resp.read())["models"][0]["name"]
    out: list[dict[str, Any]] = []
    generate(proxy, model, "Hello", 4, num_ctx, "warmup", out)
    for rep in range(2):
        for n in lengths:
            generate(proxy, model, prompt(n, f"p{n}r{rep}"), predict, num_ctx, f"proxy{n}", out)
    middle = lengths[len(lengths) // 2]
    for rep in range(2):
        generate(direct, model, prompt(middle, f"d{middle}r{rep}"), predict, num_ctx, f"direct{middle}", out)
    # a chat decoding while a long document is read beside it, sent directly (two slots, two clients)
    chat = threading.Thread(target=generate, args=(proxy, model, prompt(64, "chat"), 4 * predict, num_ctx, "chat", out))
    chat.start()
    time.sleep(1.0)
    generate(direct, model, prompt(lengths[-1], "doc"), 16, num_ctx, "doc_direct", out)
    chat.join()
    out_path.write_text(json.dumps({"model": model, "results": out}, indent=1))


# -- the comparison ---------------------------------------------------------------------------------------


def _runner_generations(log: Path) -> list[dict[str, Any]]:
    """The runner's own timings of each generation in Ollama's log (the import's reader)."""
    from collectors.ollama.history import Generation, HistoryCounts, LogHistory, read_lines

    found: list[Generation] = []
    history = LogHistory(found.append)
    with log.open("rb") as f:
        for line in read_lines(f, HistoryCounts()):
            history.feed(line)
    history.finish()
    out = []
    for g in found:
        m = g.record.metrics
        assert m is not None and m.prompt_eval_duration_ns is not None and m.eval_duration_ns is not None
        out.append(
            {
                "task": g.record.runner_task_id,
                "prompt_tokens": m.prompt_eval_count,
                "output_tokens": m.eval_count,
                "prefill_ms": m.prompt_eval_duration_ns / 1e6,
                "decode_ms": m.eval_duration_ns / 1e6,
            }
        )
    return out


def _records(data: Path) -> list[dict[str, Any]]:
    from store.export import export_rows
    from store.queries import open_readonly

    conn = open_readonly(data)
    try:
        return [r for r in export_rows(conn) if r["kind"] == "generate"]
    finally:
        conn.close()


def _same(rec: dict[str, Any], gen: dict[str, Any]) -> bool:
    if rec.get("prompt_tokens") != gen["prompt_tokens"] or rec.get("output_tokens") != gen["output_tokens"]:
        return False
    prefill, decode = rec.get("prefill_s"), rec.get("decode_s")
    return (
        prefill is not None
        and decode is not None
        and abs(prefill * 1000 - gen["prefill_ms"]) <= MS_MATCH
        and abs(decode * 1000 - gen["decode_ms"]) <= MS_MATCH
    )


def compare(data: Path, log: Path, truth: Path | None) -> dict[str, Any]:
    """Each runner generation against the store (recorded once, figures to the ms), and the client's truth."""
    records = _records(data)
    generations = _runner_generations(log)
    rows = []
    for gen in generations:
        hits = [r for r in records if _same(r, gen)]
        rows.append({**gen, "records": len(hits), "seen_from": [h["seen_from"] for h in hits]})
    matched = {id(r) for r in records for g in generations if _same(r, g)}
    report: dict[str, Any] = {
        "runner_generations": len(generations),
        "records": len(records),
        "recorded_once": sum(1 for r in rows if r["records"] == 1),
        "missing": [r for r in rows if r["records"] == 0],
        "twice": [r for r in rows if r["records"] > 1],
        "records_matching_no_runner_generation": [r["id"] for r in records if id(r) not in matched],
        "proxied": sum(1 for r in records if r["seen_from"] == "proxy"),
        "direct": sum(1 for r in records if r["seen_from"] == "runner"),
    }
    if truth is not None and truth.is_file():
        report["client"] = _against_client(records, json.loads(truth.read_text())["results"])
    report["ok"] = not report["missing"] and not report["twice"] and report["runner_generations"] > 0
    return report


def _against_client(records: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per request the client sent: its record (by Ollama's own counts and durations) and the TTFTs side by side."""
    out = []
    for res in results:
        if res.get("prompt_eval_duration") is None or res.get("eval_duration") is None:
            continue
        gen = {
            "prompt_tokens": res["prompt_eval_count"],
            "output_tokens": res["eval_count"],
            "prefill_ms": res["prompt_eval_duration"] / 1e6,
            "decode_ms": res["eval_duration"] / 1e6,
        }
        hits = [r for r in records if _same(r, gen)]
        rec = hits[0] if len(hits) == 1 else None
        out.append(
            {
                "tag": res["tag"],
                "records": len(hits),
                "client_ttft_s": res.get("ttft_s"),
                "record_ttft_s": rec.get("ttft_s") if rec else None,
                "seen_from": rec.get("seen_from") if rec else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vocab")
    v.add_argument("--from", dest="source", type=Path, required=True)
    v.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("model")
    m.add_argument("--vocab", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--size", default="12b", choices=list(SIZES))
    m.add_argument("--type", default="Q4_0", choices=("Q4_0", "Q8_0"))
    d = sub.add_parser("drive")
    d.add_argument("proxy")
    d.add_argument("direct")
    d.add_argument("out", type=Path)
    d.add_argument("--lengths", default="256,1024,4096,16384")
    d.add_argument("--predict", type=int, default=256)
    d.add_argument("--num-ctx", type=int, default=20480)
    c = sub.add_parser("compare")
    c.add_argument("--data", type=Path, required=True)
    c.add_argument("--log", type=Path, required=True)
    c.add_argument("--truth", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "vocab":
        write_vocab(a.source, a.out)
    elif a.cmd == "model":
        print(write_model(a.vocab, a.out, a.size, a.type))
    elif a.cmd == "drive":
        drive(a.proxy, a.direct, a.out, [int(x) for x in a.lengths.split(",")], a.predict, a.num_ctx)
    else:
        report = compare(a.data, a.log, a.truth)
        print(json.dumps(report, indent=1))
        return 0 if report["ok"] else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
