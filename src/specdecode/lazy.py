"""Package exports loaded on first use (PEP 562), so that importing a light module of a package
(the command line's parser, the kernel plan's names) does not import PyTorch through the package's
`__init__`: `specdecode --help` answers in a fraction of the second torch's import takes."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """A module `__getattr__` for `package` that imports each name of `exports` (name -> relative
    module) from its module when first asked for."""
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    return __getattr__
