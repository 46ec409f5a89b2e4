"""scripts/gpu_check.sh on a machine without an NVIDIA GPU: a clear message, exit 3, nothing started; and its
comparison (scripts/gpu_check.py compare) on the H200 run: every runner generation recorded once, to the ms."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.real_gpu import LOG, real_gpu_store

SCRIPT = REPO / "scripts" / "gpu_check.sh"
EXIT_NO_GPU = 3


def _run(path_dirs: list[Path], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # PATH: only the tools a shell script needs (bash's own, coreutils) and the given folders; no nvidia-smi
    path = os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": str(tmp_path), "OUT": str(tmp_path / "out"), "CUDA_HOME": str(tmp_path / "no-cuda")}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def _tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_without_nvidia_smi_it_says_so_and_starts_nothing(tmp_path: Path) -> None:
    if any((Path(d) / "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("NVIDIA's driver is installed here: the no-GPU path is the next test's (a driver listing no GPU)")
    out = _run([], tmp_path)
    assert out.returncode == EXIT_NO_GPU, out.stderr
    assert "no NVIDIA GPU here: nvidia-smi is not on PATH" in out.stderr
    assert "MODE=cpu" in out.stderr  # what to do instead
    assert not (tmp_path / "out").exists()  # nothing was started or written


def test_a_driver_that_lists_no_gpu_is_no_gpu(tmp_path: Path) -> None:
    # a fake nvidia-smi: the driver's tool without a GPU (the real thing cannot exist on CI)
    tools = tmp_path / "bin"
    _tool(tools, "nvidia-smi", 'echo "No devices were found"\nexit 6\n')
    out = _run([tools], tmp_path)
    assert out.returncode == EXIT_NO_GPU, out.stderr
    assert "nvidia-smi lists no GPU: No devices were found" in out.stderr
    assert not (tmp_path / "out").exists()


def test_a_gpu_without_cuda_compiler_says_what_to_install(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    _tool(tools, "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n')
    if any((Path(d) / "nvcc").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("CUDA's compiler is installed here: its absence cannot be shown on this machine")
    out = _run([tools], tmp_path)
    assert out.returncode == EXIT_NO_GPU, out.stderr
    assert "CUDA's compiler (nvcc) is not installed" in out.stderr and "LLAMA_BIN" in out.stderr


def test_compare_on_the_h200_run_finds_each_runner_generation_recorded_once(tmp_path: Path) -> None:
    real_gpu_store(tmp_path / "data", with_placement=False)
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "compare", "--data", str(tmp_path / "data"), "--log", str(LOG)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["runner_generations"], report["recorded_once"], report["proxied"], report["direct"]) == (13, 13, 10, 3)
    assert report["missing"] == [] and report["twice"] == [] and report["records_matching_no_runner_generation"] == []
