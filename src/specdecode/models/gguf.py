"""A GGUF file's metadata and tensor table, read directly over a memory map (no model built): what
the native backend's reader, the strict-reading check and the early checks of a path share."""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np


class _Tensor(NamedTuple):
    """A tensor of a GGUF file: its type (gguf.GGMLQuantizationType) and its bytes as numpy
    [rows, bytes a row] uint8 over the file's memory map (float types in their own dtype)."""

    tensor_type: object
    data: np.ndarray


class GGUFHeader:
    """A GGUF file's metadata and tensor table, read with `struct` over a memory map: scalars and short
    arrays kept, long arrays (a tokenizer's vocabulary and merges) stepped over, where the `gguf`
    package's reader makes a numpy view of every one of their strings (hundreds of thousands for a
    large vocabulary). The layout is GGUF's (version 2 and 3): ggml's docs/gguf.md."""

    # value type -> struct format (8: string, 9: array)
    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    KEEP_ARRAYS = 64  # longer arrays are skipped

    def __init__(self, path: Path) -> None:
        from gguf import GGMLQuantizationType as T

        stat = Path(path).stat()
        self.fields, table, start = _layout(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        self.tensors = {}
        for name, shape, kind, offset, rows, row in table:  # views over the map: no bytes read here
            data = self.map[start + offset : start + offset + rows * row].reshape(rows, row)
            if kind in (T.F32, T.F16):
                data = data.view(np.float32 if kind == T.F32 else np.float16)
            elif kind == T.BF16:
                data = data.view(np.int16)
            self.tensors[name] = _Tensor(kind, data[0] if len(shape) == 1 else data)


@lru_cache(maxsize=8)
def _layout(path: str, size: int, mtime_ns: int) -> tuple[dict, list, int]:
    """(metadata fields, tensor table as (name, shape, type, offset, rows, bytes a row), where the
    tensor data starts) of one version of a file (its size and modification time in the key): a load
    checks the file, picks a backend and reads it, and parses the header once for all three. The
    fields are shared between readers: read them, never change them."""
    try:
        return _parse(path, size)
    except struct.error:  # a length or count read past the end
        raise ValueError(f"its header is cut short (the file has {size:,} bytes)") from None


def _parse(path: str, size: int) -> tuple[dict, list, int]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    buffer, at = memoryview(np.memmap(path, dtype=np.uint8, mode="r")), 0
    scalars, keep = GGUFHeader.SCALARS, GGUFHeader.KEEP_ARRAYS

    def take(fmt: str):
        nonlocal at
        value = struct.unpack_from(fmt, buffer, at)
        at += struct.calcsize(fmt)
        return value[0]

    def string() -> str:
        nonlocal at
        n = take("<Q")
        at += n
        return bytes(buffer[at - n : at]).decode("utf-8", errors="replace")

    def value(kind: int):
        nonlocal at
        if kind in scalars:
            return take(scalars[kind])
        if kind == 8:
            return string()
        if kind != 9:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = take("<I"), take("<Q")
        if count <= keep:
            return [value(item) for _ in range(count)]
        if item in scalars:  # skipped in one step
            at += count * struct.calcsize(scalars[item])
        elif item == 8:  # strings: each one's length read, its bytes stepped over
            for _ in range(count):
                at += 8 + struct.unpack_from("<Q", buffer, at)[0]
        else:
            for _ in range(count):
                value(item)
        return None

    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError("it does not start with GGUF's magic bytes")
    at = 4
    version = take("<I")
    if version not in (2, 3):
        raise ValueError(f"it is GGUF version {version}; version 2 and 3 are read")
    tensors, count = take("<Q"), take("<Q")
    fields = {}
    for _ in range(count):
        key = string()
        fields[key] = value(take("<I"))
    table = []
    for _ in range(tensors):
        name, dims = string(), take("<I")
        shape = [take("<Q") for _ in range(dims)]  # innermost first
        table.append((name, shape, GGMLQuantizationType(take("<I")), take("<Q")))
    alignment = fields.get("general.alignment", 32)
    start = -(-at // alignment) * alignment
    layout = []
    for name, shape, kind, offset in table:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        row = shape[0] // block * block_bytes  # bytes a row
        rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if start + offset + rows * row > size:
            raise ValueError(f"it is cut short: tensor {name!r} ends at byte {start + offset + rows * row:,}, "
                             f"and the file has {size:,}")
        layout.append((name, shape, kind, offset, rows, row))
    return fields, layout, start
