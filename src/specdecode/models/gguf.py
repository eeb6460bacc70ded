"""A GGUF file's metadata and tensor table, read directly over a memory map (no model built): what
the native backend's reader, the strict-reading check and the early checks of a path share."""

from __future__ import annotations

import struct
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
        try:
            self._read(path)
        except struct.error:  # a length or count read past the end
            raise ValueError(f"its header is cut short (the file has {len(self.map):,} bytes)") from None

    def _read(self, path: Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        buffer, at = memoryview(self.map), 0

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
            if kind in self.SCALARS:
                return take(self.SCALARS[kind])
            if kind == 8:
                return string()
            if kind != 9:
                raise ValueError(f"unknown GGUF value type {kind}")
            item, count = take("<I"), take("<Q")
            if count <= self.KEEP_ARRAYS:
                return [value(item) for _ in range(count)]
            if item in self.SCALARS:  # skipped in one step
                at += count * struct.calcsize(self.SCALARS[item])
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
        tensors, fields = take("<Q"), take("<Q")
        self.fields = {}
        for _ in range(fields):
            key = string()
            self.fields[key] = value(take("<I"))
        table = []
        for _ in range(tensors):
            name, dims = string(), take("<I")
            shape = [take("<Q") for _ in range(dims)]  # innermost first
            table.append((name, shape, GGMLQuantizationType(take("<I")), take("<Q")))
        alignment = self.fields.get("general.alignment", 32)
        start = -(-at // alignment) * alignment
        self.tensors = {}
        for name, shape, kind, offset in table:
            block, block_bytes = GGML_QUANT_SIZES[kind]
            row = shape[0] // block * block_bytes  # bytes a row
            rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if start + offset + rows * row > len(self.map):
                raise ValueError(f"it is cut short: tensor {name!r} ends at byte {start + offset + rows * row:,}, "
                                 f"and the file has {len(self.map):,}")
            data = self.map[start + offset : start + offset + rows * row].reshape(rows, row)
            if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                data = data.view(np.float32 if kind == GGMLQuantizationType.F32 else np.float16)
            elif kind == GGMLQuantizationType.BF16:
                data = data.view(np.int16)
            data = data[0] if len(shape) == 1 else data
            self.tensors[name] = _Tensor(kind, data)
