"""Adapter for any Hugging Face causal LM: a local directory, or a GGUF file via transformers + gguf.

A GGUF file is dequantised by transformers once (tens of seconds) and saved as safetensors in
the specdecode cache directory; later loads take a second or two and give identical logits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from .base import Vocabulary
from .files import cache_root

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


class HFCache:
    """transformers' DynamicCache with the trim/len protocol. Trimming is `crop`: a slice."""

    def __init__(self, config) -> None:
        from transformers import DynamicCache

        self.inner = DynamicCache(config=config)
        if not self.inner.is_croppable and hasattr(self.inner, "activate_past_recording"):
            self.inner.activate_past_recording()  # sliding-window layers keep what a rollback needs
        if not self.inner.is_croppable:
            raise ValueError(
                f"the KV cache of this model ({type(config).__name__}) cannot be rolled back, "
                "so it cannot be used for speculative decoding"
            )

    def __len__(self) -> int:
        return self.inner.get_seq_length()

    def trim(self, n: int) -> None:
        if n < 0 or n > len(self):
            raise ValueError(f"cannot trim {n} positions from a cache holding {len(self)}")
        if n:
            self.inner.crop(-n)  # transformers 5.x: a negative count removes that many positions


class HFModel:
    """A transformers causal LM behind the model protocol."""

    def __init__(self, model, tokenizer, name: str) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab = Vocabulary.from_tokens(name, tokenizer.get_vocab())
        eos = set()
        for source in (getattr(model, "generation_config", None), tokenizer):
            ids = getattr(source, "eos_token_id", None)
            eos.update([ids] if isinstance(ids, int) else (ids or []))
        self.eos_token_ids = frozenset(eos)
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


def _gguf_cache_dir(gguf_path: Path, kind: str) -> Path:
    """A cache directory keyed by the GGUF file's path, size and modification time."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / kind / f"{gguf_path.stem}-{key}"


def _save_atomically(out: Path, save) -> Path:
    """Run save(tmp_dir), then rename it to `out`: a half-written directory is never mistaken for
    a finished one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        save(tmp)
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.exists():  # lost a race with another process: theirs is fine
            raise
    return out


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantise a GGUF file into a transformers directory once; return that directory."""
    gguf_path = gguf_path.resolve()
    out = _gguf_cache_dir(gguf_path, "converted")
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # transformers refuses to save a GGUF-loaded model while it still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _save_atomically(out, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def gguf_tokenizer(gguf_path: Path):
    """The transformers tokenizer stored in a GGUF file (chat template included), cached."""
    from transformers import AutoTokenizer

    gguf_path = Path(gguf_path).resolve()
    converted = _gguf_cache_dir(gguf_path, "converted")
    if (converted / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(converted)
    out = _gguf_cache_dir(gguf_path, "tokenizers")
    if not (out / "tokenizer_config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        _save_atomically(out, tokenizer.save_pretrained)
    return AutoTokenizer.from_pretrained(out)


def load_hf(path: str | os.PathLike, dtype: str = "bfloat16", device: str | None = None) -> HFModel:
    """Load a local transformers directory or a .gguf file. Nothing is downloaded."""
    path = Path(path).expanduser()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPES))}")
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (a local directory or .gguf file is needed)")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    directory = convert_gguf(path) if path.is_file() and path.suffix == ".gguf" else path
    if not (directory / "config.json").exists():
        raise ValueError(f"{str(path)!r} is neither a .gguf file nor a transformers model directory (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype]).to(device)
    return HFModel(model, tokenizer, name=path.name)
