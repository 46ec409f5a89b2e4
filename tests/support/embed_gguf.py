"""An embedding GGUF for tests: a copy of Gemma's with ``<arch>.pooling_type`` added (none ships here).

Ollama starts a runner with ``--embedding`` for a GGUF that declares pooling; llama.cpp pools the last hidden
states by that type. The copy is Gemma's header with one key/value more, its tensor infos and its tensor data as
they are (tensor offsets are relative to the data section, which starts at the next alignment boundary).
"""

from __future__ import annotations

import struct
from pathlib import Path

from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

POOLING_MEAN = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN
_HEADER_BYTES = 24  # magic, version (u32), tensor count (u64), key/value count (u64)


def _field_end(field: ReaderField) -> int:
    return int(field.offset) + sum(int(p.nbytes) for p in field.parts)


def with_pooling(src: Path, dst: Path, pooling_type: int = POOLING_MEAN) -> Path:
    """Write ``dst``: ``src`` with ``<arch>.pooling_type = pooling_type`` (a uint32) added to its header."""
    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    key = f"{arch}.pooling_type"
    if key in reader.fields:
        raise ValueError(f"{src} already declares {key}")
    kvs_end = _field_end(list(reader.fields.values())[-1])
    infos_end = _field_end(reader.tensors[-1].field)
    raw = src.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", raw, 0)
    new_kv = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", GGUFValueType.UINT32, pooling_type)
    head = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + 1) + raw[_HEADER_BYTES:kvs_end] + new_kv
    head += raw[kvs_end:infos_end]
    head += b"\0" * (-len(head) % reader.alignment)
    tmp = dst.with_suffix(".partial")
    with tmp.open("wb") as out:
        out.write(head)
        out.write(memoryview(raw)[reader.data_offset :])
    tmp.replace(dst)
    return dst
