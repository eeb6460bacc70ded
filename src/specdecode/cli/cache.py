"""`specdecode cache`: what specdecode keeps on this machine (converted models, extracted tokenizers,
compiled kernels, measured profiles and backend choices), its size, and clearing it."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..models.files import cache_root


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def entries(model: str | None = None) -> list[tuple[str, Path, int]]:
    """(kind, path, bytes) of every cached entry, or of those whose name begins with `model`."""
    root = cache_root()
    found = []
    for kind in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        for entry in sorted(kind.iterdir()):
            if model is None or entry.name.startswith(model):
                found.append((kind.name, entry, _size(entry)))
    return found


def cmd_cache(args: argparse.Namespace) -> int:
    found = entries(args.model)
    if args.action == "list":
        print(f"cache: {cache_root()} ($SPECDECODE_CACHE moves it)")
        for kind, path, size in found:
            print(f"{_human(size):>9}  {kind:<11} {path.name}")
        print(f"{_human(sum(size for _, _, size in found)):>9}  in {len(found)} entries")
        return 0
    for _, path, _ in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    print(f"cleared {len(found)} entries, {_human(sum(size for _, _, size in found))}"
          + (f" of models named {args.model}*" if args.model else ""))
    return 0
