"""A fake of macmon-lib's ``macmon`` module (0.7.2), built from its source: same classes, fields and errors.

Values are an M2 Max under an Ollama decode: GPU active ratio 0.92 at 1398 MHz, GPU 21.4 W.
``tests/collectors/gpu/test_gpu_apple.py`` checks its shape against the real package's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class MacmonError(RuntimeError):
    pass


class InvalidArgumentError(MacmonError):
    pass


class InitializationFailedError(MacmonError):
    pass


class SamplingFailedError(MacmonError):
    pass


@dataclass(frozen=True)
class GpuUsage:
    name: str
    units: int
    frequency_mhz: int
    usage: float


@dataclass(frozen=True)
class PowerMetrics:
    package: float
    cpu: float
    gpu: float
    ram: float
    gpu_ram: float
    ane: float
    board: float
    battery: float
    dc_in: float


@dataclass(frozen=True)
class MemoryMetrics:
    ram_total: int
    ram_usage: int
    swap_total: int
    swap_usage: int


@dataclass(frozen=True)
class TemperatureMetrics:
    cpu_average: float
    gpu_average: float


@dataclass(frozen=True)
class Metrics:
    cpu_usage: list[object]
    gpu_usage: list[GpuUsage]
    power: PowerMetrics
    memory: MemoryMetrics
    temperature: TemperatureMetrics


@dataclass(frozen=True)
class SocInfo:
    mac_model: str
    chip_name: str
    memory_gb: int
    cpu_domains: list[object]
    gpu_cores: int
    gpu_frequencies_mhz: list[int]


M2_MAX = SocInfo("Mac14,6", "Apple M2 Max", 64, [], 38, [444, 612, 808, 968, 1110, 1236, 1338, 1398])


def decode_metrics(gpu_usage: float = 0.92, gpu_w: float = 21.4, gpu_temp_c: float = 58.5, ram_gib: int = 64) -> Metrics:
    return Metrics(
        cpu_usage=[],
        gpu_usage=[GpuUsage("GPU", 38, 1398, gpu_usage)],
        power=PowerMetrics(package=27.9, cpu=4.1, gpu=gpu_w, ram=1.6, gpu_ram=0.4, ane=0.0, board=41.0, battery=0.0, dc_in=0.0),
        memory=MemoryMetrics(ram_total=ram_gib * 1024**3, ram_usage=ram_gib * 1024**3 // 2, swap_total=0, swap_usage=0),
        temperature=TemperatureMetrics(cpu_average=52.0, gpu_average=gpu_temp_c),
    )


@dataclass
class FakeMacmon:
    """The ``macmon`` module: ``soc_info()`` and ``Sampler()``, failing as configured."""

    soc: SocInfo = M2_MAX
    readings: list[Metrics | MacmonError] = field(default_factory=lambda: [decode_metrics()])
    init_error: MacmonError | None = None
    closed: int = 0

    def next_reading(self) -> Metrics | MacmonError:
        """The next of ``readings``; the last one repeats."""
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def soc_info(self) -> SocInfo:
        if self.init_error is not None:
            raise self.init_error
        return self.soc

    @property
    def Sampler(self) -> type:
        fake = self

        class Sampler:
            def __init__(self) -> None:
                if fake.init_error is not None:
                    raise fake.init_error
                self._released = False

            def close(self) -> None:
                self._released = True
                fake.closed += 1

            def metrics(self) -> Metrics:
                if self._released:
                    raise InvalidArgumentError("sampler has already been released")
                item = fake.next_reading()
                if isinstance(item, MacmonError):
                    raise item
                return item

        return Sampler


# The module's classes, reachable as attributes like on the real module (set here: inside the class body
# they would shadow the types its methods are annotated with).
for _cls in (
    MacmonError,
    InvalidArgumentError,
    InitializationFailedError,
    SamplingFailedError,
    Metrics,
    GpuUsage,
    PowerMetrics,
    MemoryMetrics,
    TemperatureMetrics,
    SocInfo,
):
    setattr(FakeMacmon, _cls.__name__, _cls)
