"""Llama (1, 2, 3.x; Mistral 7B's files name it too): the base the others extend. llama.cpp's
converter interleaves each q and k head's two rotary halves for its own RoPE (undone on reading);
Llama 3.x's RoPE frequency factors come as `rope_freqs` (llama.cpp's llama loader takes them unless
the scaling is LongRoPE, which strict reading refuses). Its q and k biases would be permuted by that
converter as the weights are, and none are read: a Llama file with biases is refused."""

from .base import LLAMA_LAYER, Architecture

ARCHITECTURE = Architecture("llama", LLAMA_LAYER, optional_globals=frozenset({"rope_freqs.weight"}),
                            permuted_qk=True, directory_type="llama",
                            summary="RoPE frequency factors where the file has them (Llama 3.x)")
