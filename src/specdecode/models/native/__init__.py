"""A native PyTorch Llama for CPU targets, in the spirit of gpt-fast: a static KV cache and as few,
as cheap operations per token as the architecture allows.

Why. Speculative decoding pays only where one forward over k tokens costs about one step, and a
CPU decode step is bound by the bytes of weights it reads. transformers spends most of a step in
Python and small ops; llama.cpp's quantised products are compute-bound (verifying k tokens costs
~k steps). This backend:

- Reads 4-bit weights where the model is 4-bit (a Q4_1 GGUF: its own values, see `Int4Linear`),
  else bf16 (float32 where the CPU has no bf16 units) reordered once for oneDNN (`Linear`); each
  projection group is one product (q|k|v, gate|up). With 4-bit products, an LM head stored in 8-bit
  blocks (Q8_0, as SmolLM2's GGUF stores it) runs as such (`Q8Linear`, half of bf16's bytes); else
  the head is bf16. A prefill is compute-bound, not bandwidth-bound,
  so the prompt runs through the bf16 products (an 800-token prompt: 0.97 s against 1.76 s).
- Keeps a static KV cache [layers, kv_heads, positions, head_dim], preallocated: `trim(n)` moves a
  length counter and rejected positions are simply overwritten by the next forward (gpt-fast).
- Runs RMSNorm, RoPE with the cache writes, the attention of new positions and the MLP's
  silu(gate) * up in small C kernels (`kernels.py`): one call each per layer where PyTorch needed
  ~8, ~16, one per position or 3 ops.
- Computes logits only where the caller needs them (`num_logits`), so a prefill does not run the
  49k-wide head over the whole prompt; long prompts prefill in chunks.

Exactness. Greedy speculative output equals plain greedy output only if a forward over k tokens
computes each position exactly as single steps do. Row results of the products do not depend on
the row count (bf16 inputs wider than 1024 are split, see `Linear`), RMSNorm, RoPE and the MLP are
row-wise, and after the prefill each position attends alone over exactly the keys it sees: so
every position's logits are bit-identical however the tokens after the prompt are batched (tested).
The prefill (a forward into an empty cache) attends with all its queries at once, which is fast
but rounds by its length: the decode loop therefore prefills the prompt alone, plain or
speculative, and both see the same cache.

Loads the Llama family (SmolLM2, Llama 2/3 shapes; default RoPE) from a transformers directory or
a GGUF file (dequantised once, as the `hf` backend does).
"""

from ...lazy import lazy_exports

_EXPORTS = {"NativeCache": ".cache", "Int4Linear": ".linear", "Linear": ".linear", "Q8Linear": ".linear",
            "bf16_supported": ".linear", "NativeLlama": ".model", "activation_dtype": ".model", "load_native": ".model"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
