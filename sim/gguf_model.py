"""What a real engine needs from a GGUF file and from Ollama's request, whatever runs the model.

What the real-model backend (``sim/llama_server_engine.py``) serves without asking its runner:

* ``read_model_facts``: ``/api/tags``, ``/api/show`` and ``/api/ps`` from the file's own header, as Ollama
  reads it itself (in Go, before any runner starts): its key/values (arrays longer than five items come back
  empty, as ``/api/show`` without ``verbose`` sends them), the parameter count summed over the tensors, the
  quantization named by llama.cpp's file types (``analysis.quantization``), and the file's sha256 as digest.
  The header is read by llama.cpp's own reader, the ``gguf`` package's ``GGUFReader``, told to step over long
  arrays' items, which it would otherwise make into 524k numpy views for a 262k-token vocabulary (14 s).
* ``render_prompt`` and the stop strings a base model needs for chat.
* Ollama's sampling defaults, context and batch defaults, and its queue-full message.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGUFEndian, GGUFReader, GGUFValueType

from analysis.quantization import file_type_name
from sim.backend import GenRequest
from sim.catalog import ModelFacts
from sim.ollama_time import rfc3339_from_unix_s

DEFAULT_MODEL_NAME = "gemma3:270m"
DEFAULT_NUM_CTX = 4096  # Ollama's default below 23 GiB of VRAM (none here)
DEFAULT_NUM_BATCH = 512  # Ollama's automatic num_batch for contexts up to 4K (-b/-ub)
# Ollama's sampling defaults (api/types.go DefaultOptions).
OLLAMA_DEFAULT_SAMPLING: dict[str, float] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
SHOW_ARRAY_MAX = 5  # /api/show sends longer arrays empty unless "verbose"


class EngineUnavailable(RuntimeError):
    """The engine cannot run here: its binary or library is missing, or the GGUF cannot be read."""


# --- the GGUF header --------------------------------------------------------------------------

# ReaderField.parts of an array: key length, key, value type, then the item type and the item count.
_ARRAY_COUNT_PART = 4


@dataclass(frozen=True)
class GgufHeader:
    metadata: dict[str, object]  # key -> value; arrays longer than SHOW_ARRAY_MAX as []
    array_lengths: dict[str, int]  # key -> item count, for every array
    parameter_count: int  # elements of all tensors


class _HeaderReader(GGUFReader):
    """llama.cpp's ``GGUFReader``, except that an array of more than ``SHOW_ARRAY_MAX`` scalars or strings keeps
    its count and not its items (``contents()`` gives ``[]``): the base makes two numpy views per string."""

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[npt.NDArray[Any]], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        count = self._get(orig_offs + 4, np.uint64)
        itype = int(raw_itype[0])
        scalar = self.gguf_scalar_to_np.get(GGUFValueType(itype))
        n = int(count[0])
        if n <= SHOW_ARRAY_MAX or (scalar is None and itype != GGUFValueType.STRING):
            return super()._get_field_parts(orig_offs, raw_type)  # short, or an array of arrays: item by item
        offs = orig_offs + 12
        if scalar is not None:
            offs += np.dtype(scalar).itemsize * n
        else:
            length = struct.Struct("<Q" if self.endianess == GGUFEndian.LITTLE else ">Q")
            data = self.data.data  # the memmap's buffer: struct reads it without making numpy views
            try:
                for _ in range(n):
                    offs += 8 + length.unpack_from(data, offs)[0]
            except struct.error:
                offs = len(self.data) + 1
            if offs > len(self.data):
                raise ValueError(f"the GGUF string array at byte {orig_offs} runs past the end of the file")
        return offs - orig_offs, [raw_itype, count], [], [GGUFValueType.ARRAY, GGUFValueType(itype)]


def _shortest_float32(value: float) -> float:
    """The shortest decimal that is the same float32 (1e-06, not 9.999999974752427e-07), as Go's JSON writes it."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The key/values and parameter count of a GGUF v2/v3 file; ValueError (or IndexError, KeyError on a
    damaged one) if it is not one."""
    reader = _HeaderReader(path)
    meta: dict[str, object] = {}
    lengths: dict[str, int] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for version and counts
            continue
        value = f.contents()
        if f.types[-1] == GGUFValueType.FLOAT32:
            value = [_shortest_float32(v) for v in value] if isinstance(value, list) else _shortest_float32(value)
        if f.types[0] == GGUFValueType.ARRAY:
            lengths[key] = int(f.parts[_ARRAY_COUNT_PART][0])
        meta[key] = value
    params = sum(int(t.n_elements) for t in reader.tensors)
    return GgufHeader(meta, lengths, params)


# --- model facts --------------------------------------------------------------------------------


def human_number(n: int) -> str:
    """Ollama's ``format.HumanNumber`` for parameter_size: 8.0B, 3.2B, 268.10M."""
    for unit, scale, decimals in (("B", 10**9, 1), ("M", 10**6, 2), ("K", 10**3, 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{decimals}f}{unit}"
    return str(n)


@dataclass(frozen=True)
class GgufModelFacts(ModelFacts):
    """A real model: ``ModelFacts`` read from a GGUF, whose ``model_info`` and digest are the file's own."""

    path: str = ""
    file_sha256: str = ""
    pooling_type: int | None = None  # <arch>.pooling_type: declared by an embedding model (None: a generator)
    gguf_info: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def digest(self) -> str:
        return self.file_sha256

    def model_info(self) -> dict[str, object]:
        return dict(self.gguf_info)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_model_facts(gguf_path: str | os.PathLike[str], name: str = DEFAULT_MODEL_NAME) -> GgufModelFacts:
    """What Ollama's status routes show for one GGUF, read from its header (no model is loaded)."""
    path = Path(gguf_path)
    if not path.is_file():
        raise EngineUnavailable(f"no GGUF file at {path} (python scripts/get_gemma.py writes one)")
    try:
        header = read_gguf_header(path)
    except (ValueError, IndexError, KeyError, OSError) as exc:
        raise EngineUnavailable(f"cannot read the GGUF header of {path}: {exc}") from exc
    meta = header.metadata
    arch = str(meta.get("general.architecture", "llama"))

    def num(key: str, default: float = 0) -> float:
        value = meta.get(f"{arch}.{key}", default)
        return float(value) if isinstance(value, int | float) else default

    n_vocab = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    # /api/show: the GGUF key/values minus general.name and the chat template; the parameter count computed.
    info = {k: v for k, v in sorted(meta.items()) if k not in ("general.name", "tokenizer.chat_template")}
    info["general.parameter_count"] = header.parameter_count
    info.setdefault(f"{arch}.vocab_size", n_vocab)
    file_type = meta.get("general.file_type", -1)
    head_count = int(num("attention.head_count", 1)) or 1
    embedding = int(num("embedding_length"))
    # Ollama: a GGUF that declares pooling is an embedding model (its runner is started with --embedding).
    pooling = meta.get(f"{arch}.pooling_type")
    stat = path.stat()
    return GgufModelFacts(
        name=name,
        architecture=arch,
        family=arch,
        parameter_count=header.parameter_count,
        parameter_size=human_number(header.parameter_count),
        quantization=(file_type_name(file_type) if isinstance(file_type, int) else None) or "unknown",
        size_bytes=stat.st_size,
        block_count=int(num("block_count")),
        embedding_length=embedding,
        head_count=head_count,
        head_count_kv=int(num("attention.head_count_kv", head_count)),
        head_dim=int(num("attention.key_length", embedding // head_count)),
        context_length=int(num("context_length")),
        feed_forward_length=int(num("feed_forward_length")),
        vocab_size=n_vocab,
        rope_freq_base=num("rope.freq_base", 10000.0),
        modified_at=rfc3339_from_unix_s(stat.st_mtime),
        capabilities=("embedding",) if isinstance(pooling, int) else ("completion",),
        pooling_type=pooling if isinstance(pooling, int) else None,
        template="{{ .Prompt }}",  # a base model: plain completion
        license=str(meta.get("general.license", "")),
        path=str(path),
        file_sha256=_sha256_file(path),
        gguf_info=info,
    )


# --- prompts and sampling -------------------------------------------------------------------------


TRANSCRIPT_STOPS = ("\nuser:", "\nsystem:", "\nassistant:")  # a base model would go on writing the other turns


def render_prompt(req: GenRequest) -> str:
    """Plain-completion text for a base model: the prompt as sent; chat as a plain transcript."""
    if req.messages is not None:
        lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in req.messages if isinstance(m, dict)]
        return "\n".join([*lines, "assistant:"])
    prompt = req.prompt_text or ""
    if req.system and not req.raw:
        return f"{req.system}\n\n{prompt}"
    return prompt


def ollama_sampling(options: dict[str, Any]) -> dict[str, float]:
    """Ollama's sampling options with its defaults where absent or not a number."""
    out: dict[str, float] = {}
    for key, default in OLLAMA_DEFAULT_SAMPLING.items():
        value = options.get(key, default)
        out[key] = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    return out


def stop_strings(req: GenRequest) -> list[str]:
    """The request's stop strings; for chat without any, the transcript's turn markers."""
    stop = req.options.get("stop")
    stops = [str(s) for s in stop] if isinstance(stop, list) else [str(stop)] if isinstance(stop, str) else []
    if req.messages is not None and not stops:
        stops = list(TRANSCRIPT_STOPS)  # what a Modelfile's PARAMETER stop does for a chat template
    return [s for s in stops if s]
