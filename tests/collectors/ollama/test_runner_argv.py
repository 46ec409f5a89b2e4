"""Which processes are runners, from their name and command line (the forms Ollama's versions start)."""

from __future__ import annotations

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
    assert runner_from_argv(7, "llama-server", argv) == Runner(7, 40123, BLOB, n_ctx=8192, n_parallel=4)
    equals = ["llama-server", f"--model={BLOB}", "--port=40124", "--ctx-size=4096", "--parallel", "1"]
    assert runner_from_argv(8, "llama-server", equals) == Runner(8, 40124, BLOB, n_ctx=4096, n_parallel=1)


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
