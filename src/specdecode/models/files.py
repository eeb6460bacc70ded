"""Model files and where specdecode keeps what it builds on a machine (converted models, compiled
kernels, profiles): every backend's one way from a path to a model directory."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

from ..progress import waiting


def cache_root() -> Path:
    """$SPECDECODE_CACHE, else ~/.cache/specdecode."""
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode"))


def existing_model_path(path: str | os.PathLike) -> Path:
    """The model path, expanded, where something is there; a .gguf file checked to be one whole
    (`check_gguf_file`), a directory to hold a model (`check_model_directory`). Else one sentence saying what is wrong and what to do, before any loading."""
    path = Path(path).expanduser()
    if not path.exists():
        text = str(path)
        if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) and not text.endswith(".gguf"):
            raise FileNotFoundError(
                f"{text!r} is not a local file or directory; it looks like a Hugging Face hub id, and models are "
                f"local files here (nothing is downloaded): fetch the .gguf file or the model directory first, e.g. "
                f"`huggingface-cli download {text} --local-dir {text.split('/')[-1]}`, and pass its path")
        raise FileNotFoundError(f"model path {text!r} does not exist (a .gguf file or a transformers model "
                                "directory is needed)")
    if is_gguf(path):
        check_gguf_file(path)
    elif path.is_dir():
        check_model_directory(path, path)
    return path


def check_gguf_file(path: Path) -> None:
    """A clear error where a .gguf file is not one, or is cut short: what a GGUF file holds, and what
    this one holds instead (llama.cpp's own loader says only that it failed)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise ValueError(f"{path.name} is not a GGUF file: a GGUF file starts with the bytes 'GGUF', this one with "
                         f"{head!r} ({path.stat().st_size} bytes in all)")
    from .gguf import GGUFHeader

    try:
        GGUFHeader(path)
    except Exception as err:  # a header cut short, or tensors past the end: whatever the reader met
        raise ValueError(f"{path.name} is not a whole GGUF file: {err}") from None


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def check_model_directory(path: Path, directory: Path) -> None:
    """A clear error where `directory` (the one behind `path`) is no transformers model directory: a
    config, weights and a tokenizer."""
    if not (directory / "config.json").exists():
        raise ValueError(f"{str(path)!r} is neither a .gguf file nor a transformers model directory (no config.json)")
    for what, names in (("weights", WEIGHTS), ("tokenizer", TOKENIZER)):
        if not any((directory / name).exists() for name in names):
            raise ValueError(f"{str(path)!r} has a config.json but no {what} ({', '.join(names)}): a model "
                             "directory holds all three, as a model's save_pretrained writes them")


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
    with waiting(f"converting {gguf_path.name} for transformers", once=True):
        return _convert(gguf_path, out)


def _convert(gguf_path: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = _tokenizer_class(gguf_path).from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # transformers refuses to save a GGUF-loaded model while it still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _save_atomically(out, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def gguf_tokenizer(gguf_path: Path):
    """The tokenizer stored in a GGUF file (chat template included): transformers reads it from the
    file once and saves it; later loads read the saved files without transformers (`Tokenizer`)."""
    from .tokenizer import Tokenizer, has_fast_files

    gguf_path = Path(gguf_path).resolve()
    converted = _gguf_cache_dir(gguf_path, "converted")
    if has_fast_files(converted):
        return Tokenizer(converted)
    out = _gguf_cache_dir(gguf_path, "tokenizers")
    if not has_fast_files(out):
        with waiting(f"reading the tokenizer of {gguf_path.name}", once=True):
            tokenizer = _tokenizer_class(gguf_path).from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            _save_atomically(out, tokenizer.save_pretrained)
    return Tokenizer(out)


def _tokenizer_class(gguf_path: Path):
    """The transformers tokenizer class AutoTokenizer picks for a GGUF file, by its architecture:
    AutoTokenizer learns the architecture by parsing the whole file with the `gguf` package's reader,
    a numpy view a string (19 s of a Llama 3 file's 23 s, 8 s for SmolLM2's), where the header's own
    reader takes a tenth of a second. The tokenizer is then read from the file as AutoTokenizer reads it."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    from .gguf import GGUFHeader

    architecture = GGUFHeader(gguf_path).fields.get("general.architecture")
    return tokenizer_class_from_name(TOKENIZER_MAPPING_NAMES.get(architecture) or "TokenizersBackend")
