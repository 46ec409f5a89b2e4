"""The shape of a Python API read from its source with ``ast`` (no import, so no native library needed).

Used to check the amdsmi and macmon-lib fakes against the real packages: the snapshots in
``tests/data/*_api.json`` were read from the PyPI wheels (amdsmi 7.0.2, macmon-lib 0.7.2) with
``python -m tests.support.api_shape``; where the real package is installed, the tests read it too.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"
AMDSMI_NAMES = (
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_activity",
    "amdsmi_get_gpu_vram_usage",
    "amdsmi_get_power_info",
    "amdsmi_get_clk_freq",
    "amdsmi_get_temp_metric",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_gpu_device_uuid",
    "AmdSmiException",
    "AmdSmiLibraryException",
    "AmdSmiClkType",
    "AmdSmiTemperatureType",
    "AmdSmiTemperatureMetric",
)
MACMON_NAMES = (
    "MacmonError",
    "InitializationFailedError",
    "SamplingFailedError",
    "Sampler",
    "soc_info",
    "Metrics",
    "GpuUsage",
    "PowerMetrics",
    "MemoryMetrics",
    "TemperatureMetrics",
    "SocInfo",
)


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]


def _dict_keys(fn: ast.FunctionDef) -> list[str]:
    """String keys of dict displays built in the function (the keys its returned dicts carry)."""
    return sorted(
        {
            k.value
            for d in ast.walk(fn)
            if isinstance(d, ast.Dict)
            for k in d.keys
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    )


def shape_of_source(sources: Iterable[str], names: Iterable[str]) -> dict[str, Any]:
    wanted = set(names)
    out: dict[str, Any] = {}
    for text in sources:
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                out[node.name] = {"params": _params(node), "dict_keys": _dict_keys(node)}
            elif isinstance(node, ast.ClassDef) and node.name in wanted:
                out[node.name] = {
                    "bases": [ast.unparse(b).split(".")[-1] for b in node.bases],
                    "fields": [t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)]
                    + [t.id for a in node.body if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)],
                    "methods": {f.name: _params(f) for f in node.body if isinstance(f, ast.FunctionDef)},
                }
    return out


def shape_of_object(obj: Any, names: Iterable[str]) -> dict[str, Any]:
    """The same shape read from a fake module's objects (parameters by inspect, members by name)."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        if inspect.isclass(value):
            out[name] = {
                "bases": [b.__name__ for b in value.__bases__ if b is not object],
                "fields": list(getattr(value, "__dataclass_fields__", {}))
                or [m for m in vars(value) if not m.startswith("_") and not callable(vars(value)[m])]
                or list(getattr(value, "__members__", {})),
                "methods": {
                    m: list(inspect.signature(f).parameters)
                    for m, f in vars(value).items()
                    if inspect.isfunction(f)
                    and f.__qualname__.startswith(value.__name__ + ".")
                    and not hasattr(value, "__dataclass_fields__")  # generated methods: not in the source
                },
            }
        else:
            out[name] = {"params": list(inspect.signature(value).parameters)}
    return out


def installed_sources(package: str, files: Iterable[str]) -> list[str] | None:
    """The source text of an installed package's files, found without importing it; None if not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return [(folder / f).read_text() for f in files if (folder / f).is_file()]


def load_snapshot(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{name}_api.json").read_text()))


if __name__ == "__main__":  # python -m tests.support.api_shape amdsmi|macmon <unpacked package folder>
    which, folder = sys.argv[1], Path(sys.argv[2])
    if which == "amdsmi":
        shape = shape_of_source([(folder / f).read_text() for f in ("amdsmi_interface.py", "amdsmi_exception.py")], AMDSMI_NAMES)
    else:
        shape = shape_of_source([(folder / "__init__.py").read_text()], MACMON_NAMES)
    (DATA / f"{which}_api.json").write_text(json.dumps(shape, indent=1, sort_keys=True) + "\n")
