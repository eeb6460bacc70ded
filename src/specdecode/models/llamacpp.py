"""llama.cpp backend (llama-cpp-python): any GGUF file, quantised, on CPU threads.

One forward is one `llama_decode` over the new tokens, with logits requested only at the
positions the caller needs (the draft's g+1, not the whole prefill). Rolling back is the
memory/sequence-remove call: positions past the kept length are dropped from the KV cache.
A llama.cpp context holds one KV cache, so each model has one live cache: `new_cache()` clears
it, and a cache handle from before refuses further use.

Batch invariance. Speculative greedy output equals plain greedy output only if a forward over k
tokens computes each position's logits exactly as k single steps would. llama.cpp's CPU kernels
do not by default: without flash attention batched attention rounds differently (logits differ
by up to ~0.9, enough to flip near-tied argmaxes), and with flash attention a single query over
an F16/F32 cache view of 512+ cells (past ~256 cached positions) splits the keys across threads
(split-KV), a different summation order than the batched path. So by default (`batch_invariant=True`) the context runs
flash attention with keys cached as Q8_0 and values as F16: no split path, and every position's
logits are bit-identical however the tokens are batched (tested up to 3,000 cached positions and
16-token batches). Measured here, a step costs the same as with llama.cpp's F16 cache, and its
logits differ from the F16 cache's about as much as turning flash attention on or off does
(argmax agreement ~97% along Spec-Bench summaries either way). `batch_invariant=False` keeps the
F16 cache: identical up to 256 cached positions only.

No extra weight-buffer types. llama.cpp can move weights into "extra" CPU buffer types at load
time: repacked layouts and, on Xeons with AMX, its AMX buffer. Built natively on an AMX host,
llama-cpp-python 0.3.36 moves SmolLM2's Q4_1 weights into the AMX buffer and segfaults on the
first `llama_decode` (the whole Python process dies). Loading with the model parameter
`use_extra_bufts = False` avoids it; `Llama(...)` does not expose that parameter, so `open_llama`
sets it for every context specdecode opens (the model under test and the benchmark's anchors).
The same setting on every host keeps the numerics the same on AMX and non-AMX machines; for
Q4_1 weights (the embedded model) the repacked layouts do not apply anyway.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from .base import Vocabulary, check_trim, eos_ids

INSTALL_HINT = "pip install llama-cpp-python (it compiles llama.cpp from source, a few minutes)"
_PARAMS_LOCK = threading.Lock()


@contextmanager
def _no_extra_buffer_types():
    """While active, llama-cpp-python's default model parameters have `use_extra_bufts` off."""
    import llama_cpp.llama as llama_module

    with _PARAMS_LOCK:
        defaults = llama_module.llama_cpp.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_module.llama_cpp.llama_model_default_params = without_extra_bufts
        try:
            yield
        finally:
            llama_module.llama_cpp.llama_model_default_params = defaults


def open_llama(path: str | os.PathLike, **kwargs):
    """`llama_cpp.Llama(path, **kwargs)` with no extra weight-buffer types (see the module docstring)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ImportError(f"the llama.cpp backend needs llama-cpp-python: {INSTALL_HINT}") from None
    with _no_extra_buffer_types():
        llm = Llama(str(path), **kwargs)
    if llm.model_params.use_extra_bufts:
        raise RuntimeError("llama.cpp was loaded with extra buffer types, which crash on AMX CPUs")
    return llm


def cpu_has_amx() -> bool:
    """Whether this CPU reports AMX tile units (Linux /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False


class LlamaCppCache:
    def __init__(self, model: "LlamaCppModel", generation: int) -> None:
        self.model = model
        self.generation = generation
        self.length = 0

    def check(self) -> None:
        if self.generation != self.model.generation:
            raise RuntimeError("this llama.cpp cache was replaced by a newer new_cache() on the same model")

    def __len__(self) -> int:
        return self.length

    def trim(self, n: int) -> None:
        self.check()
        check_trim(n, self.length)
        if n:
            self.length -= n
            self.model.ctx.kv_cache_seq_rm(0, self.length, -1)  # drop positions [length, end)


class LlamaCppModel:
    """A GGUF model run by llama.cpp behind the model protocol."""

    backend = "llama.cpp"

    def __init__(self, path: str | os.PathLike, n_threads: int | None = None, n_ctx: int = 4096,
                 n_batch: int = 512, tokenizer=None, batch_invariant: bool = True) -> None:
        path = Path(path).expanduser()
        if not path.is_file() or path.suffix != ".gguf":
            raise FileNotFoundError(f"the llama.cpp backend needs a .gguf file; {str(path)!r} is not one")
        self.n_threads = n_threads or torch.get_num_threads()
        self.batch_invariant = batch_invariant
        self.llm = open_llama(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=self.n_threads,
                         n_threads_batch=self.n_threads, logits_all=False, verbose=False, **self.context_options)
        self.ctx = self.llm._ctx
        self.name = path.name
        self.path = str(path)
        self.dtype = "gguf"
        self.n_vocab = self.llm.n_vocab()
        self.n_batch = n_batch
        if tokenizer is None:
            from .files import gguf_tokenizer

            tokenizer = gguf_tokenizer(path)
        self.tokenizer = tokenizer
        self.vocab = Vocabulary.from_tokens(self.name, tokenizer.get_vocab())
        self.eos_token_ids = eos_ids(self.llm.token_eos(), tokenizer)
        self.max_positions = n_ctx
        self.generation = 0
        self.device = "cpu"

    @property
    def context_options(self) -> dict:
        """llama.cpp context settings that fix the numerics (see the module docstring)."""
        from llama_cpp import GGML_TYPE_F16, GGML_TYPE_Q8_0

        options = dict(flash_attn=True)
        if self.batch_invariant:
            options.update(type_k=GGML_TYPE_Q8_0, type_v=GGML_TYPE_F16)
        return options

    def new_cache(self) -> LlamaCppCache:
        self.generation += 1
        self.ctx.kv_cache_seq_rm(0, 0, -1)
        return LlamaCppCache(self, self.generation)

    def forward(self, tokens: torch.Tensor, cache: LlamaCppCache, num_logits: int | None = None) -> torch.Tensor:
        """tokens [1, T] -> logits [1, num_logits or T, V] float32; appends T positions."""
        cache.check()
        if tokens.shape[0] != 1:
            raise ValueError(f"the llama.cpp backend runs batch size 1, got {tokens.shape[0]}")
        ids = tokens[0].tolist()
        k = len(ids) if not num_logits else min(num_logits, len(ids))
        batch = self.llm._batch
        rows = []
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start : start + self.n_batch]
            batch.set_batch(batch=chunk, n_past=cache.length, logits_all=False)
            wanted = 0
            for j in range(len(chunk)):  # logits only where the caller needs them
                need = start + j >= len(ids) - k
                batch.batch.logits[j] = need
                wanted += need
            self.ctx.decode(batch)
            cache.length += len(chunk)
            if wanted:
                out = np.ctypeslib.as_array(self.ctx.get_logits(), shape=(wanted * self.n_vocab,))
                rows.append(out.reshape(wanted, self.n_vocab).copy())
        return torch.from_numpy(np.concatenate(rows)).unsqueeze(0)  # [1, k, V]

    def __repr__(self) -> str:
        return f"LlamaCppModel({self.name}, {self.n_threads} threads)"
