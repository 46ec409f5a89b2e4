"""requirements.txt installs everywhere: each GPU library only where it applies."""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement

from tests.support.paths import REPO

REQUIREMENTS = REPO / "requirements.txt"
LINUX = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux"}
MAC_ARM = {"sys_platform": "darwin", "platform_machine": "arm64", "platform_system": "Darwin"}
MAC_INTEL = {"sys_platform": "darwin", "platform_machine": "x86_64", "platform_system": "Darwin"}
WINDOWS = {"sys_platform": "win32", "platform_machine": "AMD64", "platform_system": "Windows"}


def _requirements() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def _wanted(env: dict[str, str]) -> set[str]:
    return {r.name for r in _requirements() if r.marker is None or r.marker.evaluate(env)}


def test_macmon_lib_only_on_apple_silicon_and_amdsmi_never_required() -> None:
    assert "macmon-lib" in _wanted(MAC_ARM)
    for env in (LINUX, MAC_INTEL, WINDOWS):
        assert "macmon-lib" not in _wanted(env)
    assert all("amdsmi" not in _wanted(env) for env in (LINUX, MAC_ARM, MAC_INTEL, WINDOWS))  # needs ROCm: optional
    assert "nvidia-ml-py" in _wanted(LINUX) and "nvidia-ml-py" in _wanted(MAC_ARM)  # pure Python, harmless anywhere


def test_everything_wanted_here_is_installed_here() -> None:
    """What pip would install on this machine from requirements.txt is what the project's environment holds."""
    here = [r for r in _requirements() if r.marker is None or r.marker.evaluate()]
    for r in here:
        assert r.specifier.contains(importlib.metadata.version(r.name), prereleases=True), r
