"""A greedy first token before PyTorch is imported.

Importing PyTorch alone takes 2-3 s on a 2-core machine, longer than the whole prompt of a chat
turn takes to prefill on the embedded model. The C kernels need none of it: `decode_layers` runs
every layer from raw addresses, and the LM head is one more C product. So after a native model has
loaded once, `save` writes what those calls read (the layers' tensors in `decode_layers`' slots,
the final norm, the head, the RoPE tables, the tied embedding's rows) to one file in the cache,
and `first_logits` later maps that file with numpy and computes the prompt's last logits with the
same C calls on the same bytes: bit for bit the logits `NativeLlama.forward` returns (tested), so
the greedy first token shown early is the one the loaded model then produces.

Only where the model's own prefill takes that route: prompts through the decode layers row by row
(`row_invariant_prompts`), every product a C one on float32 activations, no sliding window, no
embedding scale or logit softcap, an embedding read from the tied 8-bit head (or a float table).
`refusal` names what stops a model; such a model simply has no early token.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..files import cache_root
from .plan import DecodeModel, kernel_plan

ALIGN = 64
VERSION = 2  # of the snapshot's layout: part of its key, so that a snapshot of another layout is not found
# the head products called as product(x, weights, coefficients, y, rows, in, out, threads) on float32 x
HEAD_KINDS = ("q8", "q8q8", "q6q8", "q6kq8", "q4f", "q4q8", "q5q8", "q40q8", "q4kq8", "q5kq8")
EMBEDDING_ROWS = ("q8", "q8q8")  # a tied head's layouts whose rows `_embed` reads back


def key(model_path: Path, settings: dict) -> str:
    """Names a snapshot by the model file (path, size, modification time), the kernel build and the
    loading settings that decide what runs (backend, dtype, threads and context asked for)."""
    plan, _ = kernel_plan()
    stat = model_path.stat()
    text = (f"{VERSION}|{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{plan.path}|"
            f"{Path(plan.library).name if plan.library else '-'}|{json.dumps(settings, sort_keys=True)}")
    return f"{model_path.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def location(model_path: Path, settings: dict) -> Path:
    return cache_root() / "first-token" / key(model_path, settings)


def refusal(model) -> str | None:
    """Why `first_logits` cannot compute this native model's first logits as its forward does, or None."""
    if model.c_layers is None:
        return "its layers do not all run in the C decode layers"
    if not model.row_invariant_prompts:
        return "its prompts are prefilled through other products than its decode steps"
    if any(model.windows) or model.embed_scale != 1.0 or model.softcap > 0:
        return "it has a sliding window, an embedding scale or a logit softcap"
    if getattr(model.head, "kind", None) not in HEAD_KINDS:
        return "its LM head is not a C product on float32 activations"
    if model.kernels.products["stacked"] in model.c_tensors()[1]:
        return "a product stacks parts of different formats (its descriptor holds addresses)"
    table = model.embedding.weight
    if not (_tied(model) and model.head.kind in EMBEDDING_ROWS) and not (
            hasattr(table, "numpy") and str(table.dtype) == "torch.float32"):
        return "its embedding is neither the tied 8-bit head's rows nor a float32 table"
    return None


def _tied(model) -> bool:
    """Whether the model looks its embeddings up in its head's rows (`Q8Linear.rows`)."""
    return getattr(model.embedding.weight, "__self__", None) is model.head


# decode_layers' shapes (plan.DecodeModel's fields after its three addresses), as the model's C layers hold them
SHAPES = [name for name, _ in DecodeModel._fields_[3:]]


def save(model, directory: Path, choice_file: Path | None = None) -> bool:
    """Write `model`'s snapshot to `directory` (False, nothing written, where `refusal` says no).
    `choice_file`: the measured backend choice that picked the native backend, which must still
    say so when the snapshot is read."""
    if refusal(model) is not None:
        return False
    tensors: list[np.ndarray] = []

    def add(tensor) -> int:  # the tensor's index in the file, -1 for none
        if tensor is None:
            return -1
        tensors.append(np.ascontiguousarray(tensor.numpy()))
        return len(tensors) - 1

    layers, kinds = model.c_tensors()
    slots = [[add(t) for t in layer] for layer in layers]
    head = model.head
    a, b = (head.q, head.scales) if hasattr(head, "scales") else (head.packed, head.coef)
    meta = dict(
        slots=slots, kinds=kinds, shapes=[getattr(model.c_layers, name) for name in SHAPES], threads=model.n_threads,
        head_kind=head.kind, head=[add(a), add(b)], vocab=head.out_features, norm=add(model.norm),
        rope=[add(model.cos), add(model.sin)], max_positions=model.max_positions,
        embedding="tied" if _tied(model) else add(model.embedding.weight),
        tokenizer=str(model.tokenizer.directory), eos=sorted(model.eos_token_ids),
        choice=None if choice_file is None else [str(choice_file), _digest(choice_file)])
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-t.nbytes // ALIGN) * ALIGN
    meta["tensors"] = [[o, t.dtype.str, list(t.shape)] for o, t in zip(offsets, tensors)]
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"weights.bin.{os.getpid()}"
    with open(partial, "wb") as f:
        for o, t in zip(offsets, tensors):
            f.seek(o)
            f.write(t.tobytes())
        f.truncate(size)
    partial.replace(directory / "weights.bin")
    (directory / "meta.json").write_text(json.dumps(meta))  # last: a snapshot without it is not one
    return True


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Snapshot:
    """A saved snapshot, mapped: `first_logits` of a prompt, and the tokenizer it was saved with."""

    def __init__(self, directory: Path) -> None:
        self.meta = meta = json.loads((directory / "meta.json").read_text())
        data = np.memmap(directory / "weights.bin", dtype=np.uint8, mode="r")
        self.tensors = [np.ndarray(shape, dtype, data, offset) for offset, dtype, shape in meta["tensors"]]
        self.data = data

    def valid(self) -> bool:
        """Whether the backend choice it was saved under (if any) still stands unchanged."""
        choice = self.meta["choice"]
        return choice is None or (Path(choice[0]).exists() and _digest(Path(choice[0])) == choice[1])

    def tokenizer(self):
        from ..tokenizer import Tokenizer

        return Tokenizer(Path(self.meta["tokenizer"]))

    def _address(self, index: int) -> int:
        return 0 if index < 0 else self.tensors[index].ctypes.data

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of the embedding [T, D] float32, as `NativeLlama.embedding` reads them."""
        m = self.meta
        if m["embedding"] != "tied":
            return self.tensors[m["embedding"]][ids]
        q, scales = (self.tensors[i] for i in m["head"])
        block, o = ids // 16, ids % 16
        rows = scales[block, :, o]  # [T, in / 32]
        if m["head_kind"] == "q8q8":  # [out/16, in/32, 8, 16, 4] bytes, q + 128
            values = q[block, :, :, o].astype(np.int16) - 128  # [T, in / 32, 8, 4]
        else:  # [out/16, in, 16] int8
            values = q[block, :, o]  # [T, in]
        T = len(ids)
        return (values.reshape(T, rows.shape[1], -1).astype(np.float32) * rows[..., None]).reshape(T, -1)

    def first_logits(self, ids: Sequence[int], chunk: int = 256) -> np.ndarray | None:
        """The last position's logits [V] float32 of prompt `ids`, or None where it does not fit the
        context or the kernels lack memory."""
        m = self.meta
        _, lib = kernel_plan()
        if lib is None or not 0 < len(ids) <= m["max_positions"]:
            return None
        pointers = np.array([[self._address(i) for i in layer] for layer in m["slots"]], dtype=np.int64)
        kinds = np.array(m["kinds"], dtype=np.int32).reshape(-1, 4)
        layers = DecodeModel(pointers.ctypes.data, kinds.ctypes.data, None, *m["shapes"])
        T, D, threads = len(ids), layers.dim, m["threads"]
        keys = np.empty((layers.layers, layers.kv_heads, T, layers.head_dim), dtype=np.float32)
        values = np.empty_like(keys)
        cos, sin = (self.tensors[i] for i in m["rope"])
        x = self._embed(np.asarray(ids, dtype=np.int64))  # [T, D]
        for start in range(0, T, chunk):  # as the model's forward feeds a prompt: in chunks of PREFILL_CHUNK
            rows = x[start : start + chunk]
            n = rows.shape[0]
            table = np.array([[n, keys.ctypes.data, values.ctypes.data, T, start, 0]], dtype=np.int64)
            if lib.decode_layers(ctypes.byref(layers), rows.ctypes.data, n, table.ctypes.data, 1,
                                 cos[start:].ctypes.data, sin[start:].ctypes.data, None, None, threads):
                return None
        last = np.ascontiguousarray(x[-1:])
        normed = np.empty_like(last)
        lib.rms_norm_f32(last.ctypes.data, self.tensors[m["norm"]].ctypes.data, normed.ctypes.data, 1, D, layers.eps)
        logits = np.empty((1, m["vocab"]), dtype=np.float32)
        q, coefficients = (self.tensors[i] for i in m["head"])
        if getattr(lib, f"{m['head_kind']}_matmul")(normed.ctypes.data, q.ctypes.data, coefficients.ctypes.data,
                                                    logits.ctypes.data, 1, D, m["vocab"], threads):
            return None
        return logits[0]


def open_snapshot(model_path: Path, settings: dict) -> Snapshot | None:
    """The snapshot saved for this model and these settings, where there is one still valid."""
    directory = location(model_path, settings)
    if not (directory / "meta.json").exists():
        return None
    try:
        snapshot = Snapshot(directory)
    except (OSError, ValueError, KeyError, TypeError):  # a file cut short, or from another version
        return None
    return snapshot if snapshot.valid() else None


def greedy(logits: np.ndarray) -> int | None:
    """The argmax (the lowest id among ties, as torch's), or None where a logit is not finite (the
    loaded model then says what is wrong)."""
    if not np.isfinite(logits).all():
        return None
    return int(np.argmax(logits))
