"""What a real engine needs from a GGUF file and from Ollama's request, whatever runs the model.

What the real-model backend (``sim/llama_server_engine.py``) serves without asking its runner:

* ``read_model_facts``: ``/api/tags``, ``/api/show`` and ``/api/ps`` from the file's own header, as Ollama
  reads it itself (in Go, before any runner starts): its key/values (arrays longer than five items come back
  empty, as ``/api/show`` without ``verbose`` sends them), the parameter count summed over the tensors, and
  the file's sha256 as digest. The header is read directly: its layout is small and fixed (GGUF v2/v3), and
  the ``gguf`` package builds every one of a 262k-token vocabulary's strings, 14 s on our machines.
* ``render_prompt`` and the stop strings a base model needs for chat.
* Ollama's sampling defaults, context and batch defaults, and its queue-full message.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.backend import GenRequest
from sim.catalog import ModelFacts
from sim.ollama_time import rfc3339_from_unix_s

DEFAULT_MODEL_NAME = "gemma3:270m"
DEFAULT_NUM_CTX = 4096  # Ollama's default below 23 GiB of VRAM (none here)
DEFAULT_NUM_BATCH = 512  # Ollama's automatic num_batch for contexts up to 4K (-b/-ub)
QUEUE_FULL_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"
# llama_ftype values (llama.h) -> Ollama's quantization_level.
FILE_TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    28: "IQ4_XS",
    32: "BF16",
}
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

GGUF_MAGIC = b"GGUF"
# GGUF value types -> struct format of one scalar (8 = string, 9 = array are read apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_FLOAT32, _STRING, _ARRAY = 6, 8, 9


@dataclass(frozen=True)
class GgufHeader:
    metadata: dict[str, object]  # key -> value; arrays longer than SHOW_ARRAY_MAX as []
    array_lengths: dict[str, int]  # key -> item count, for every array
    parameter_count: int  # elements of all tensors


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def skip_string(self) -> None:
        n = self.scalar("<Q")
        self.pos += n

    def value(self, vtype: int) -> object:
        if vtype == _STRING:
            return self.string()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")
        value = self.scalar(fmt)
        return _shortest_float32(value) if vtype == _FLOAT32 else value


def _shortest_float32(value: float) -> float:
    """The shortest decimal that is the same float32 (1e-06, not 9.999999974752427e-07), as Go's JSON writes it."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The key/values and parameter count of a GGUF v2/v3 file; ValueError if it is not one."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        cur.pos = 4
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        meta: dict[str, object] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            if vtype != _ARRAY:
                meta[key] = cur.value(vtype)
                continue
            itype, count = cur.scalar("<I"), cur.scalar("<Q")
            lengths[key] = count
            keep = count <= SHOW_ARRAY_MAX
            items: list[object] = []
            if itype == _STRING:
                for _ in range(count):
                    if keep:
                        items.append(cur.string())
                    else:
                        cur.skip_string()
            elif itype in _SCALARS:
                size = struct.calcsize(_SCALARS[itype])
                if keep:
                    items = [cur.value(itype) for _ in range(count)]
                else:
                    cur.pos += size * count
            else:
                raise ValueError(f"GGUF array of type {itype} under {key!r} is not supported")
            meta[key] = items
        params = 0
        for _ in range(n_tensors):
            cur.skip_string()  # name
            n_dims = cur.scalar("<I")
            elements = 1
            for _ in range(n_dims):
                elements *= cur.scalar("<Q")
            cur.pos += 4 + 8  # type, offset
            params += elements
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
    except (ValueError, OSError, struct.error) as exc:
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
    stat = path.stat()
    return GgufModelFacts(
        name=name,
        architecture=arch,
        family=arch,
        parameter_count=header.parameter_count,
        parameter_size=human_number(header.parameter_count),
        quantization=FILE_TYPE_NAMES.get(file_type if isinstance(file_type, int) else -1, "unknown"),
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
        capabilities=("completion",),
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
