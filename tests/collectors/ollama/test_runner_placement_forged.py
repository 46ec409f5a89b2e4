"""Load lines forged into Ollama's log do not move a runner's placement (issue 39 F10).

Anyone who can reach Ollama's API can have whole lines printed into its log (the runner echoes an invalid grammar or
JSON schema verbatim). A load line counts only inside the runner's own start sequence: from Ollama's ``starting
llama-server`` line naming its port to the runner's listening line, confirmed by a runner found on that port whose
process started after the start line was written. Here the log is a real one (the H200 run's load, the CPU build's)
read by the collector's runner reader; the runner's process start is what discovery reads (psutil)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from analysis.runner_placement import MAX_DEVICES
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogTail
from collectors.ollama.runner_loads import START_LINE_READ_LAG_S
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import RunnerReader
from tests.support.paths import REPO

H200 = REPO / "tests" / "data" / "runner_load" / "h200_cuda_gemma3_12b.log"
CPU = REPO / "tests" / "data" / "llama_server_logs" / "prompt4k_batch512.log"
PORT = 48613
START = (
    'time=2026-12-04T18:31:01.404+00:00 level=INFO source=llama_server.go:431 msg="starting llama-server" '
    'cmd="/bin/llama-server --model /m.gguf --port {port} --host 127.0.0.1 -c 40960 -np 2"'
)
LISTENING = "srv  llama_server: listening on http://127.0.0.1:{port}"
# What the attacker printed: six lines that made a CPU-only runner "7/19 layers on CUDA0 (NVIDIA H200)".
FORGED_LOAD = [
    "llama_prepare_model_devices: using device CUDA0 (NVIDIA H200) (0000:00:06.0) - 142629 MiB free",
    "load_tensors: offloaded 7/19 layers to GPU",
    "load_tensors:        CUDA0 model buffer size =   100.00 MiB",
    "llama_kv_cache:      CUDA0 KV buffer size =  9999.00 MiB",
    "sched_reserve:      CUDA0 compute buffer size =   874.02 MiB",
    "xload_tensors: offloaded 19/19 layers to GPU",
]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reader(log: Path, clock: Clock) -> RunnerReader:
    return RunnerReader(
        "http://127.0.0.1:1", cast(Any, None), in_flight=list, loaded_models=list, log_source=LogTail(log), clock=clock
    )


def append(log: Path, *lines: str) -> None:
    with log.open("a") as f:
        f.write("\n".join(lines) + "\n")


def runner_up(r: RunnerReader, started_unix_s: float, pid: int = 4242) -> None:
    """Discovery found the runner on PORT: its pid and when its process started."""
    r.runners[pid] = RunnerState(Runner(pid, PORT, "/m.gguf", n_parallel=2), model="m:1b", started_unix_s=started_unix_s)
    r._adopt_sequences()


def test_forged_load_lines_after_the_runner_is_up_do_not_put_a_layer_on_a_gpu(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("")
    clock = Clock(1_000_000.0)
    r = reader(log, clock)
    r._read_log([])
    real = [x for x in CPU.read_text().splitlines() if "listening on" not in x]
    append(log, START.format(port=PORT), *real, LISTENING.format(port=PORT))
    r._read_log([])
    runner_up(r, clock.now + 0.5)  # Ollama spawned it right after its start line
    before = r.placement_of("m:1b")
    assert before is not None and before.gpu_fraction == 0.0 and before.devices == ()
    clock.now += 60
    append(log, *FORGED_LOAD)  # echoed by the runner, now that it serves
    r._read_log([])
    after = r.placement_of("m:1b")
    assert after == before, "no load line after the runner is up moves its placement"
    assert r.log_dropped()["placement"] == len(FORGED_LOAD) - 1  # xload_tensors: is no load line at all


def test_a_forged_start_line_naming_the_real_port_does_not_wipe_the_real_placement(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("")
    clock = Clock(1_000_000.0)
    r = reader(log, clock)
    r._read_log([])
    append(log, START.format(port=PORT), *H200.read_text().splitlines(), LISTENING.format(port=PORT))
    r._read_log([])
    runner_up(r, clock.now + 0.5)
    real = r.placement_of("m:1b")
    assert real is not None and (real.layers_offloaded, real.layers_total) == (49, 49)
    clock.now += 2 * START_LINE_READ_LAG_S
    append(log, START.format(port=PORT), *FORGED_LOAD, LISTENING.format(port=PORT))
    r._read_log([])
    r._adopt_sequences()  # a discovery round: the same runner process, started long before that start line
    assert r.placement_of("m:1b") == real
    # Ollama really restarting the runner on that port: a new process, its own sequence, taken.
    clock.now += 60
    append(log, START.format(port=PORT), *H200.read_text().splitlines()[:40], "load_tensors: offloaded 30/49 layers to GPU")
    append(log, LISTENING.format(port=PORT))
    r._read_log([])
    del r.runners[4242]
    runner_up(r, clock.now + 0.2, pid=4343)
    again = r.placement_of("m:1b")
    assert again is not None and (again.layers_offloaded, again.layers_total) == (30, 49)


def test_device_names_in_one_load_are_bounded(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("")
    clock = Clock(1_000_000.0)
    r = reader(log, clock)
    r._read_log([])
    many = [f"load_tensors:      CUDA{i} model buffer size =     1.00 MiB" for i in range(5_000)]
    append(log, START.format(port=PORT), "load_tensors: offloaded 19/19 layers to GPU", *many, LISTENING.format(port=PORT))
    r._read_log([])
    runner_up(r, clock.now)
    placement = r.placement_of("m:1b")
    assert placement is not None and len(placement.devices) <= MAX_DEVICES
    assert r.log_dropped()["placement"] >= 5_000 - MAX_DEVICES
