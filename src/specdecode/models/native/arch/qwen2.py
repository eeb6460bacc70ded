"""Qwen2 (and Qwen2.5): a Llama with biases on q, k and v (all three or none)."""

from .base import LLAMA_LAYER, QKV_BIASES, Architecture

ARCHITECTURE = Architecture("qwen2", LLAMA_LAYER, optional_layer_tensors=QKV_BIASES, summary="q, k, v biases")
