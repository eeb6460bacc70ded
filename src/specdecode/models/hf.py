"""Adapter for any Hugging Face causal LM: a local directory, or a GGUF file via transformers + gguf.

A GGUF file is dequantised by transformers once (tens of seconds) and saved as safetensors in
the specdecode cache directory; later loads take a second or two and give identical logits.
"""

from __future__ import annotations

import os

import torch

from .base import DTYPES, Vocabulary, check_trim, eos_ids
from .files import model_directory

class HFCache:
    """transformers' DynamicCache with the trim/len protocol. Trimming is `crop`: a slice."""

    def __init__(self, config) -> None:
        from transformers import DynamicCache

        self.inner = DynamicCache(config=config)
        # sliding-window layers (Gemma 3's, Mistral's) keep what a rollback needs only when asked to
        for layer in [self.inner, *getattr(self.inner, "layers", ())]:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()
        if not self.inner.is_croppable:
            raise ValueError(
                f"the KV cache of this model ({type(config).__name__}) cannot be rolled back, "
                "so it cannot be used for speculative decoding"
            )

    def __len__(self) -> int:
        return self.inner.get_seq_length()

    def trim(self, n: int) -> None:
        check_trim(n, len(self))
        if n:
            self.inner.crop(-n)  # transformers 5.x: a negative count removes that many positions


class HFModel:
    """A transformers causal LM behind the model protocol."""

    backend = "hf"

    def __init__(self, model, tokenizer, name: str) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab = Vocabulary.from_tokens(name, tokenizer.get_vocab())
        self.eos_token_ids = eos_ids(getattr(model, "generation_config", None), tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)

    def new_cache(self) -> HFCache:
        return HFCache(self.model.config)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: HFCache, num_logits: int | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T or num_logits, V] float32 on the model's device."""
        out = self.model(
            input_ids=tokens.to(self.device),
            cache=cache.inner,
            use_cache=True,
            logits_to_keep=num_logits or 0,
        )
        return out.logits.float()  # stays on the model's device: sampling and verification follow it

    def __repr__(self) -> str:
        return f"HFModel({self.name}, {self.dtype}, {self.device})"


def load_hf(path: str | os.PathLike, dtype: str = "bfloat16", device: str | None = None) -> HFModel:
    """Load a local transformers directory or a .gguf file. Nothing is downloaded."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPES))}")
    path, directory = model_directory(path)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype]).to(device)
    return HFModel(model, tokenizer, name=path.name)
