"""An embedding GGUF for tests: a copy of Gemma's with ``<arch>.pooling_type`` added (none ships here).

Ollama starts a runner with ``--embedding`` for a GGUF that declares pooling; llama.cpp pools the last hidden
states by that type. The copy is Gemma's header with one key/value more, its tensor infos and its tensor data as
they are (tensor offsets are relative to the data section, which starts at the next alignment boundary). The header
is walked here, by the GGUF layout (``gguf.constants``' value types), rather than with ``GGUFReader``, which makes
numpy views of all 262k vocabulary strings (seconds, where this takes a fraction of one).
"""

from __future__ import annotations

import struct
from pathlib import Path

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType

POOLING_MEAN = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN
_SCALAR = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class _Walker:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.at = 0

    def take(self, fmt: str) -> int | float | bool:
        (value,) = struct.unpack_from("<" + fmt, self.raw, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = int(self.take("Q"))
        self.at += n
        return self.raw[self.at - n : self.at].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> object:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype, count = int(self.take("I")), int(self.take("Q"))
            if itype in _SCALAR:  # a run of scalars: stepped over whole
                self.at += count * struct.calcsize("<" + _SCALAR[GGUFValueType(itype)])
            else:
                for _ in range(count):
                    self.value(itype)
            return None
        return self.take(_SCALAR[GGUFValueType(vtype)])


def with_pooling(src: Path, dst: Path, pooling_type: int = POOLING_MEAN) -> Path:
    """Write ``dst``: ``src`` with ``<arch>.pooling_type = pooling_type`` (a uint32) added to its header."""
    raw = src.read_bytes()
    w = _Walker(raw)
    magic, version, n_tensors, n_kv = w.take("4s"), w.take("I"), int(w.take("Q")), int(w.take("Q"))
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = w.string()
        meta[key] = w.value(int(w.take("I")))
    kvs_end = w.at
    for _ in range(n_tensors):
        w.string()
        n_dims = int(w.take("I"))
        w.at += 8 * n_dims + 4 + 8  # dims, type, offset
    infos_end = w.at
    alignment = int(meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
    data_start = infos_end + (-infos_end % alignment)
    key = f"{meta['general.architecture']}.pooling_type"
    if key in meta:
        raise ValueError(f"{src} already declares {key}")
    new_kv = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", GGUFValueType.UINT32, pooling_type)
    head = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + 1) + raw[24:kvs_end] + new_kv + raw[kvs_end:infos_end]
    head += b"\0" * (-len(head) % alignment)
    tmp = dst.with_suffix(".partial")
    with tmp.open("wb") as out:
        out.write(head)
        out.write(memoryview(raw)[data_start:])
    tmp.replace(dst)
    return dst
