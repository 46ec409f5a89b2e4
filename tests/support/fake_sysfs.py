"""A fake ``/sys`` with amdgpu cards, laid out and worded as the kernel's amdgpu driver writes it.

Values are those of an RX 7900 XTX at work (kernel 6.8): ``pp_dpm_mclk`` lists the memory
clock levels with ``*`` on the current one, hwmon power is in µW, temperatures in m°C.
Used by the sysfs reader's tests, ``python -m collectors.gpu --json`` and the browser test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

XTX_MCLK = "0: 96Mhz\n1: 456Mhz\n2: 772Mhz\n3: 1249Mhz *\n"
XTX_SCLK = "0: 500Mhz\n1: 2371Mhz *\n2: 2526Mhz\n"


@dataclass
class FakeCard:
    number: int = 1
    product_name: str | None = "AMD Radeon RX 7900 XTX"
    pci_slot: str = "0000:03:00.0"
    busy_pct: int = 87
    mem_busy_pct: int | None = 41
    vram_used_bytes: int = 9_126_805_504
    vram_total_bytes: int = 25_753_026_560
    mclk: str | None = XTX_MCLK
    sclk: str | None = XTX_SCLK
    hwmon: bool = True
    power_average_uw: int | None = 291_000_000
    power_input_uw: int | None = None
    power_cap_uw: int | None = 355_000_000
    temps_mc: dict[str, int] = field(default_factory=lambda: {"edge": 61_000, "junction": 78_000, "mem": 70_000})


def write_card(root: Path, card: FakeCard) -> Path:
    """Write one card (and a DP connector entry beside it, as the kernel does); returns its device folder."""
    drm = root / "class" / "drm"
    device = drm / f"card{card.number}" / "device"
    device.mkdir(parents=True)
    (drm / f"card{card.number}-DP-1").mkdir()  # a connector: not a GPU
    (drm / f"card{card.number}-DP-1" / "status").write_text("connected\n")
    files: dict[str, object] = {
        "gpu_busy_percent": card.busy_pct,
        "mem_busy_percent": card.mem_busy_pct,
        "mem_info_vram_used": card.vram_used_bytes,
        "mem_info_vram_total": card.vram_total_bytes,
        "pp_dpm_mclk": card.mclk,
        "pp_dpm_sclk": card.sclk,
        "product_name": card.product_name,
        "vendor": "0x1002",
        "device": "0x744c",
        "uevent": f"DRIVER=amdgpu\nPCI_CLASS=30000\nPCI_ID=1002:744C\nPCI_SLOT_NAME={card.pci_slot}\n",
    }
    for name, value in files.items():
        if value is not None:
            text = value if isinstance(value, str) else f"{value}\n"
            (device / name).write_text(text)
    if card.hwmon:
        hwmon = device / "hwmon" / f"hwmon{card.number + 2}"
        hwmon.mkdir(parents=True)
        (hwmon / "name").write_text("amdgpu\n")
        for name, value in (
            ("power1_average", card.power_average_uw),
            ("power1_input", card.power_input_uw),
            ("power1_cap", card.power_cap_uw),
        ):
            if value is not None:
                (hwmon / name).write_text(f"{value}\n")
        for n, (label, value) in enumerate(card.temps_mc.items(), start=1):
            (hwmon / f"temp{n}_input").write_text(f"{value}\n")
            (hwmon / f"temp{n}_label").write_text(f"{label}\n")
    return device


def write_tree(root: Path, *cards: FakeCard) -> Path:
    """A fake sysfs root with these cards, plus a non-AMD card0 (no gpu_busy_percent) like an iGPU on simpledrm."""
    (root / "class" / "drm" / "card0" / "device").mkdir(parents=True)
    (root / "class" / "drm" / "version").write_text("drm 1.1.0 20060810\n")
    for card in cards or (FakeCard(),):
        write_card(root, card)
    return root
