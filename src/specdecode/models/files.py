"""Where specdecode keeps what it builds on a machine: converted models, compiled kernels, profiles."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$SPECDECODE_CACHE, else ~/.cache/specdecode."""
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode"))
