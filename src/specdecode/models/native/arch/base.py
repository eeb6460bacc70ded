"""What an architecture module declares (`Architecture`), and the pieces several share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# A layer's tensors (the names after `blk.N.`) every architecture here computes with
LLAMA_LAYER = frozenset(f"{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"))
QK_NORMS = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})
QKV_BIASES = frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"})


def no_hyper(read: Callable[..., Any], layers: int, dim: int, heads: int, head_dim: int) -> dict:
    return {}


@dataclass(frozen=True)
class Architecture:
    name: str  # general.architecture
    layer_tensors: frozenset[str]  # each layer has all of them
    optional_layer_tensors: frozenset[str] = frozenset()
    optional_globals: frozenset[str] = frozenset()  # beside token_embd, output_norm and a tied or own output
    keys: frozenset[str] = frozenset()  # keys of its own (after `{name}.`) implemented, beside `reading.IMPLEMENTED`
    permuted_qk: bool = False  # llama.cpp's converter interleaved each q and k head's rotary halves
    # hyper(read, layers, dim, heads, head_dim) -> its own `Hyper` fields; read(key after `{name}.`,
    # default) gives a key's value (no default: the file must have it)
    hyper: Callable[..., dict] = field(default=no_hyper)
    summary: str = ""  # what it adds to a Llama, for `info`
    directory_type: str | None = None  # a transformers config's model_type the directory loader reads as it
