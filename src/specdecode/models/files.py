"""Model files and where specdecode keeps what it builds on a machine (converted models, compiled
kernels, profiles): every backend's one way from a path to a model directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path


def cache_root() -> Path:
    """$SPECDECODE_CACHE, else ~/.cache/specdecode."""
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode"))


def existing_model_path(path: str | os.PathLike) -> Path:
    """The model path, expanded; a clear error where nothing is there."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (a local directory or .gguf file is needed)")
    return path


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


def check_model_directory(path: Path, directory: Path) -> None:
    """A clear error where `directory` (the one behind `path`) is no transformers model directory."""
    if not (directory / "config.json").exists():
        raise ValueError(f"{str(path)!r} is neither a .gguf file nor a transformers model directory (no config.json)")


def model_directory(path: str | os.PathLike) -> tuple[Path, Path]:
    """(the path as given, expanded; the transformers directory behind it): a directory as it is, a
    .gguf file dequantised once (`convert_gguf`). A clear error for a path that is neither."""
    path = existing_model_path(path)
    directory = convert_gguf(path) if is_gguf(path) else path
    check_model_directory(path, directory)
    return path, directory


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
    import torch
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
