"""Which processes are runners, from their name and command line (the forms Ollama's versions start)."""

from __future__ import annotations

from analysis.speculative import Speculation
from collectors.ollama.discovery import Runner, ollama_local_port, runner_from_argv

BLOB = "/usr/share/ollama/.ollama/models/blobs/sha256-" + "0f" * 32


def test_llama_server_as_ollama_starts_it() -> None:
    argv = [
        "/usr/lib/ollama/llama-server",
        "--model",
        BLOB,
        "--port",
        "40123",
        "--host",
        "127.0.0.1",
        "--no-webui",
        "--offline",
        "-c",
        "8192",
        "-np",
        "4",
        "-b",
        "512",
    ]
    assert runner_from_argv(7, "llama-server", argv) == Runner(7, 40123, BLOB, n_ctx=8192, n_parallel=4, n_batch=512)
    equals = ["llama-server", f"--model={BLOB}", "--port=40124", "--ctx-size=4096", "--parallel", "1"]
    assert runner_from_argv(8, "llama-server", equals) == Runner(8, 40124, BLOB, n_ctx=4096, n_parallel=1)


def test_the_settings_in_force_are_read_from_the_command_line() -> None:
    """Every setting that decides memory and speed, in the short and long forms llama-server takes; a flag that
    is not given stays None (the runner's default holds, which the command line does not tell)."""
    short = ["llama-server", "--port", "1", "-c", "16384", "-np", "2", "-b", "1024", "-ub", "256"]
    short += ["-ctk", "q8_0", "-ctv", "q4_0", "-fa", "off", "-ngl", "33", "-t", "6"]
    r = runner_from_argv(3, "llama-server", short)
    assert r is not None
    got = (r.n_ctx, r.n_parallel, r.n_batch, r.n_ubatch, r.cache_type_k, r.cache_type_v, r.flash_attn, r.gpu_layers, r.threads)
    assert got == (16384, 2, 1024, 256, "q8_0", "q4_0", "off", "33", 6)
    long = ["llama-server", "--port=1", "--batch-size=2048", "--ubatch-size", "512", "--cache-type-k", "f16"]
    long += ["--cache-type-v=q8_0", "--flash-attn=auto", "--n-gpu-layers", "all", "--threads", "8"]
    r = runner_from_argv(3, "llama-server", long)
    assert r is not None
    got_long = (r.n_batch, r.n_ubatch, r.cache_type_k, r.cache_type_v, r.flash_attn, r.gpu_layers, r.threads)
    assert got_long == (2048, 512, "f16", "q8_0", "auto", "all", 8)
    bare = runner_from_argv(3, "llama-server", ["llama-server", "--port", "1"])
    assert bare is not None
    assert (bare.n_batch, bare.cache_type_k, bare.flash_attn, bare.gpu_layers, bare.threads) == (None,) * 5


def test_a_draft_model_and_the_speculative_settings_are_read() -> None:
    """llama-server's names today (``--spec-draft-model``/``-md``, ``--spec-type``, ``--spec-draft-n-max/min``) and
    the older ones (``--model-draft``, ``--draft-max``, ``--draft-min``)."""
    draft = "/models/blobs/sha256-" + "d" * 64
    today = ["llama-server", "--port", "1", "-m", BLOB, "-md", draft, "--spec-type", "draft-simple"]
    today += ["--spec-draft-n-max", "8", "--spec-draft-n-min", "2"]
    r = runner_from_argv(3, "llama-server", today)
    assert r is not None and r.model_path == BLOB, "-md is the draft, not the model"
    assert r.speculation == Speculation(draft, ("draft-simple",), 8, 2) and r.speculation.active
    older = ["llama-server", "--port", "1", f"--model-draft={draft}", "--draft-max", "16", "--draft-min=4"]
    r = runner_from_argv(3, "llama-server", older)
    assert r is not None and r.speculation == Speculation(draft, (), 16, 4)
    mtp = runner_from_argv(3, "llama-server", ["llama-server", "--port", "1", "--spec-type", "none,draft-mtp"])
    assert mtp is not None and mtp.speculation == Speculation(None, ("draft-mtp",), None, None) and mtp.speculation.active
    off = runner_from_argv(3, "llama-server", ["llama-server", "--port", "1", "--spec-type", "none"])
    assert off is not None and not off.speculation.active
    bare = runner_from_argv(3, "llama-server", ["llama-server", "--port", "1"])
    assert bare is not None and bare.speculation == Speculation() and not bare.speculation.active


def test_speculative_values_llama_server_would_refuse_are_not_guessed() -> None:
    odd = ["llama-server", "--port", "1", "--spec-type", "draft mtp<b>", "--spec-draft-n-max", "-3"]
    r = runner_from_argv(3, "llama-server", [*odd, "--draft-min", "9" * 40])
    assert r is not None and r.speculation == Speculation()
    many = runner_from_argv(3, "llama-server", ["llama-server", "--port", "1", "--spec-type", ",".join(["ngram-mod"] * 9)])
    assert many is not None and many.speculation.spec_types == ()


def test_flash_attention_as_a_bare_flag_and_the_go_runner_kv_type() -> None:
    """Older llama.cpp and Ollama's Go runner take ``--flash-attn`` alone (on) and ``--kv-cache-type`` for K and V."""
    go = ["ollama", "runner", "--model", BLOB, "--ctx-size", "8192", "--batch-size", "512", "--n-gpu-layers", "29"]
    go += ["--threads", "8", "--flash-attn", "--kv-cache-type", "q8_0", "--parallel", "1", "--port", "40001"]
    r = runner_from_argv(4, "ollama", go)
    assert r is not None and r.kind == "ollama runner"
    assert (r.flash_attn, r.cache_type_k, r.cache_type_v, r.gpu_layers, r.threads) == ("on", "q8_0", "q8_0", "29", 8)
    last = runner_from_argv(4, "llama-server", ["llama-server", "-fa", "--port", "2", "-fa", "off"])
    assert last is not None and last.flash_attn == "off", "the last one given wins, as in llama.cpp's parser"
    odd = runner_from_argv(4, "llama-server", ["llama-server", "--port", "2", "--flash-attn=sometimes"])
    assert odd is not None and odd.flash_attn is None, "a value llama.cpp would refuse is not guessed"


def test_older_ollama_runner() -> None:
    argv = ["/usr/local/bin/ollama", "runner", "--model", BLOB, "--port", "35555"]
    assert runner_from_argv(9, "ollama", argv) == Runner(9, 35555, BLOB, kind="ollama runner")
    assert runner_from_argv(10, "ollama", ["ollama", "serve"]) is None, "the server itself is not a runner"


def test_not_runners() -> None:
    assert runner_from_argv(1, "llama-server", ["llama-server", "--model", BLOB]) is None, "no port: nothing to read"
    assert runner_from_argv(1, "llama-server", ["llama-server", "--port", "99999"]) is None
    remote = ["llama-server", "--port", "8080", "--host", "192.168.1.5"]
    assert runner_from_argv(1, "llama-server", remote) is None, "loopback only"
    assert runner_from_argv(1, "python3", ["python3", "-m", "sim", "--port", "11434"]) is None


def test_only_a_local_ollama_has_runners_to_read() -> None:
    assert ollama_local_port("http://127.0.0.1:11434") == 11434
    assert ollama_local_port("http://localhost") == 80
    assert ollama_local_port("http://[::1]:8080") == 8080
    assert ollama_local_port("http://gpu-box.lan:11434") is None


def test_windows_and_mlx_runners() -> None:
    """Issue 45: Windows names it ``llama-server.exe`` (a path with backslashes); Apple Silicon's MLX runner is
    ``ollama runner --mlx-engine --model NAME --port N`` (a model's name, no file)."""
    exe = r"C:\Users\me\AppData\Local\Programs\Ollama\lib\ollama\llama-server.exe"
    found = runner_from_argv(7, "llama-server.exe", [exe, "--model", BLOB, "--port", "50001"])
    assert found is not None and (found.kind, found.port, found.model_path) == ("llama-server", 50001, BLOB)
    mlx = runner_from_argv(
        8,
        "ollama",
        [
            "/Applications/Ollama.app/Contents/Resources/ollama",
            "runner",
            "--mlx-engine",
            "--model",
            "qwen3:8b-mlx",
            "--port",
            "50002",
        ],
    )
    assert mlx is not None and (mlx.kind, mlx.port, mlx.model_path) == ("mlx runner", 50002, "qwen3:8b-mlx")
    assert runner_from_argv(9, "ollama.exe", ["ollama.exe", "runner", "--port", "50003"]) is not None
