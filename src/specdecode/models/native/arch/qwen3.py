"""Qwen3: a Llama with an RMSNorm on each head's q and k before RoPE."""

from .base import LLAMA_LAYER, QK_NORMS, Architecture

ARCHITECTURE = Architecture("qwen3", LLAMA_LAYER | QK_NORMS, summary="RMSNorms of each head's q and k")
