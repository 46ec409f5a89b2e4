"""``python -m sim``: an Ollama-compatible server with a physical timing model."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
from pathlib import Path

from aiohttp import web

from analysis.command_line import ExitCode
from sim import cloud, ollama_log
from sim.catalog import MODELS
from sim.context_fit import log_start_lines
from sim.engine import SimEngine
from sim.faults import Faults
from sim.ollama_time import keep_alive_ns
from sim.profiles import DEFAULT_PROFILE, PROFILES, SimProfile
from sim.server import ServerConfig, build_app


def _epilog() -> str:
    hw = "\n".join(
        f"  {p.key:<10} {p.spec.name}: {p.spec.bandwidth_bytes_s / 1e9:.0f} GB/s, "
        f"{p.spec.fp16_flops / 1e12:.1f} TFLOP/s, {p.spec.memory_bytes / 2**30:.0f} GiB"
        for p in PROFILES.values()
    )
    models = "\n".join(
        f"  {m.name:<16} {m.parameter_size} {m.quantization}, {m.size_bytes / 1e9:.2f} GB, "
        f"{m.block_count} layers, ctx {m.context_length}"
        for m in MODELS
    )
    routes = "GET|DELETE /sim/truth, GET /sim/gpu, GET|POST|DELETE /sim/faults (see sim/README.md)"
    return f"hardware profiles:\n{hw}\n\nmodels:\n{models}\n\nextra routes: {routes}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sim",
        description="Ollama-compatible simulator: Ollama's HTTP API with roofline timing.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=11434, help="port (default 11434)")
    ap.add_argument(
        "--hardware",
        default=DEFAULT_PROFILE,
        choices=list(PROFILES),
        metavar="NAME",
        help=f"hardware profile (default {DEFAULT_PROFILE}; listed below)",
    )
    ap.add_argument("--num-parallel", type=int, default=1, metavar="N", help="slots per model (OLLAMA_NUM_PARALLEL, default 1)")
    ap.add_argument(
        "--max-queue", type=int, default=512, metavar="N", help="pending loads before 503 (OLLAMA_MAX_QUEUE, default 512)"
    )
    ap.add_argument(
        "--max-loaded-models",
        type=int,
        default=0,
        metavar="N",
        help="models loaded at once; a load beyond it evicts the least recently used idle one "
        "(OLLAMA_MAX_LOADED_MODELS, default 0: 3 per GPU)",
    )
    ap.add_argument("--keep-alive", default="5m", metavar="DURATION", help="default keep-alive (OLLAMA_KEEP_ALIVE, default 5m)")
    ap.add_argument(
        "--ollama-version", default="0.33.3", metavar="V", help="version to report; >= 0.33.3 adds prompt_eval_cached_count"
    )
    ap.add_argument(
        "--disk-gbs",
        type=float,
        default=None,
        metavar="GB/S",
        help="override the profile's load speed (e.g. a warm page cache), GB/s",
    )
    ap.add_argument(
        "--metrics",
        action="store_true",
        help="serve /metrics (Prometheus text: ollama_requests_queued per model), as Ollama would with OLLAMA_METRICS set",
    )
    ap.add_argument("--seed", type=int, default=0, metavar="N", help="seed for the generated text")
    ap.add_argument(
        "--context-length",
        type=int,
        default=0,
        metavar="N",
        help="default num_ctx (OLLAMA_CONTEXT_LENGTH; default 0: Ollama's VRAM-based default)",
    )
    ap.add_argument(
        "--no-context-shift",
        action="store_true",
        help="play a model whose runner cannot shift its context: a prompt longer than it is a 400, not cut",
    )
    ap.add_argument(
        "--engine",
        default="sim",
        choices=["sim", "llama-server", "mlx"],
        help="sim: the roofline model (default); llama-server: a real GGUF run by llama.cpp's llama-server "
        "child, as Ollama >= 0.30 runs it (sim/llama_server_engine.py); mlx: a stand-in for Apple Silicon's MLX "
        "runner child, 'ollama runner --mlx-engine' (sim/mlx_engine.py; --model-name picks a catalog model)",
    )
    ap.add_argument(
        "--gguf", default=None, metavar="PATH", help="with a real engine: the model file (python scripts/get_gemma.py writes one)"
    )
    ap.add_argument("--model-name", default="gemma3:270m", metavar="NAME", help="with a real engine: the name it is served as")
    ap.add_argument("--threads", type=int, default=2, metavar="N", help="with a real engine: CPU threads (default 2)")
    ap.add_argument(
        "--kv-cache-type",
        default="f16",
        choices=["f16", "q8_0", "q4_0"],
        help="with a real engine: the KV cache type (OLLAMA_KV_CACHE_TYPE, default f16)",
    )
    ap.add_argument(
        "--flash-attention",
        default="auto",
        choices=["on", "off", "auto"],
        help="with a real engine: flash attention (OLLAMA_FLASH_ATTENTION; default auto, llama-server's own)",
    )
    ap.add_argument(
        "--draft-gguf",
        default=None,
        metavar="PATH",
        help="with --engine llama-server: a draft model for speculative decoding, passed to the child as "
        "--spec-draft-model PATH --spec-type draft-simple (llama-server's own flags)",
    )
    ap.add_argument(
        "--draft-max",
        type=int,
        default=None,
        metavar="N",
        help="with --draft-gguf: tokens drafted a step at most (--spec-draft-n-max; default llama-server's own)",
    )
    ap.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="with --engine llama-server: the binary (default: $PHASEWATCH_LLAMA_SERVER, the one "
        "scripts/build_llama_server.sh builds, or llama-server on PATH)",
    )
    ap.add_argument(
        "--cloud-model",
        action="append",
        default=[],
        metavar="NAME",
        help="serve NAME (a ':cloud' or '-cloud' tag) as Ollama serves a cloud model: listed with remote_model and "
        "remote_host, answered as ollama.com answers, no runner (sim/cloud.py); may be given more than once",
    )
    ap.add_argument(
        "--log-file",
        default=None,
        metavar="PATH",
        type=Path,
        help="also append Ollama's log (access lines, load lines, the runner's output) to this file; "
        "it always goes to stdout, as from a service",
    )
    ap.add_argument(
        "--log-rotate",
        action="store_true",
        help="with --log-file: first rename it as Ollama's macOS and Windows apps do at each server start "
        f"(server.log → server-1.log, the older ones shifted, {ollama_log.ROTATION_KEPT} kept)",
    )
    args = ap.parse_args(argv)
    if args.engine == "llama-server" and not args.gguf:
        ap.error(f"--engine {args.engine} needs --gguf PATH")
    if args.kv_cache_type != "f16" and args.flash_attention == "off":
        ap.error("a quantized KV cache needs flash attention (llama.cpp refuses it with --flash-attention off)")
    if args.num_parallel < 1:
        ap.error("--num-parallel must be >= 1")
    if args.disk_gbs is not None and args.disk_gbs <= 0:
        ap.error("--disk-gbs must be > 0")
    if args.max_loaded_models < 0:
        ap.error("--max-loaded-models must be >= 0")
    if args.max_queue < 0:
        ap.error("--max-queue must be >= 0")
    try:
        cloud.check_names(args.cloud_model)
    except ValueError as e:
        ap.error(f"--cloud-model: {e}")
    try:
        args.keep_alive_ns = keep_alive_ns(args.keep_alive if not args.keep_alive.lstrip("-").isdigit() else int(args.keep_alive))
    except ValueError as e:
        ap.error(f"--keep-alive: {e}")
    return args


async def serve(args: argparse.Namespace) -> None:
    if args.log_file is not None:
        if args.log_rotate:
            ollama_log.rotate(args.log_file)
        ollama_log.open_file(args.log_file)
    faults = Faults()
    profile = PROFILES[args.hardware]
    if args.disk_gbs:
        profile = dataclasses.replace(profile, disk_read_bytes_s=args.disk_gbs * 1e9)
    engine = SimEngine(
        profile,
        num_parallel=args.num_parallel,
        max_queue=args.max_queue,
        default_keep_alive_ns=args.keep_alive_ns,
        faults=faults,
        max_loaded_models=args.max_loaded_models,
        context_length=args.context_length or None,
        context_shift=not args.no_context_shift,
    )
    if args.engine == "llama-server":
        from sim.gguf_model import EngineUnavailable
        from sim.llama_server_engine import LlamaServerEngine, add_engine_routes

        try:
            child = LlamaServerEngine(
                args.gguf,
                model_name=args.model_name,
                binary=args.llama_server,
                n_threads=args.threads,
                num_parallel=args.num_parallel,
                kv_cache_type=args.kv_cache_type,
                flash_attn=args.flash_attention,
                max_queue=args.max_queue,
                default_keep_alive_ns=args.keep_alive_ns,
                context_shift=not args.no_context_shift,
                draft_gguf=args.draft_gguf,
                draft_max_tokens=args.draft_max,
                **({"default_num_ctx": args.context_length} if args.context_length else {}),
            )
        except EngineUnavailable as e:
            print(f"sim: {e}", file=sys.stderr, flush=True)
            raise SystemExit(ExitCode.USAGE) from None
        app = build_app(child, _config(args), faults)
        add_engine_routes(app, child)
        args.hardware = f"llama-server ({child.binary}) on the CPU, {args.threads} threads, {child.model.name} from {args.gguf}"
    elif args.engine == "mlx":
        from sim.mlx_engine import MlxEngine

        mlx = MlxEngine(args.model_name, default_keep_alive_ns=args.keep_alive_ns)
        app = build_app(mlx, _config(args), faults)
        args.hardware = f"a stand-in MLX runner for {mlx.model.name}"
    else:
        app = build_app(engine, _config(args), faults)
    _start_lines(args, profile)
    # handler_cancellation: a client that disconnects cancels its handler, which frees its slot at once.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    print(
        f"sim: listening on http://{args.host}:{args.port} (hardware {args.hardware}, "
        f"num_parallel {args.num_parallel}, version {args.ollama_version})",
        file=sys.stderr,
        flush=True,
    )
    # SIGTERM (service managers, tests) and SIGINT stop it cleanly: open streams end, models unload.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        print("sim: stopped", file=sys.stderr, flush=True)
        ollama_log.close_file()


def _config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        ollama_version=args.ollama_version, seed=args.seed, metrics=args.metrics, cloud_models=tuple(args.cloud_model)
    )


def _start_lines(args: argparse.Namespace, profile: SimProfile) -> None:
    """Ollama's start lines with the settings sim runs with (sim/context_fit.py)."""
    env = {
        "OLLAMA_CONTEXT_LENGTH": str(args.context_length),
        "OLLAMA_FLASH_ATTENTION": str(args.flash_attention == "on").lower(),
        "OLLAMA_HOST": f"http://{args.host}:{args.port}",
        "OLLAMA_KEEP_ALIVE": args.keep_alive,
        "OLLAMA_KV_CACHE_TYPE": "" if args.kv_cache_type == "f16" else args.kv_cache_type,
        "OLLAMA_MAX_LOADED_MODELS": str(args.max_loaded_models),
        "OLLAMA_MAX_QUEUE": str(args.max_queue),
        "OLLAMA_NUM_PARALLEL": str(args.num_parallel),
    }
    real = args.engine != "sim"  # the real engine runs on the CPU here
    vram = 0 if real else profile.vram_bytes
    log_start_lines(
        env,
        gpu_name=None if real or vram == 0 else profile.gpu_name,
        total_vram_bytes=vram if vram else profile.spec.memory_bytes,
        available_vram_bytes=vram if vram else profile.spec.memory_bytes,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import uvloop

        runner: contextlib.AbstractContextManager[asyncio.Runner] = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner as r, contextlib.suppress(KeyboardInterrupt):
        r.run(serve(args))


if __name__ == "__main__":
    main()
