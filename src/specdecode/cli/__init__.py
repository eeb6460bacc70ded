"""The command line: `specdecode generate | info | analyze | alpha | profile | bench | serve | check | ngram
fit | distill`. `parser.py` defines every command's options; each command is a function of the parsed
arguments (`cmd_*` in generate, analysis, bench, fit and serve) that returns the exit code."""

from __future__ import annotations

import importlib
import os
import sys

from .parser import build_parser

# command -> (module, function): a command's module (and what it imports) loads only when it runs
COMMANDS = {"generate": ("generate", "cmd_generate"), "info": ("analysis", "cmd_info"),
            "analyze": ("analysis", "cmd_analyze"), "alpha": ("analysis", "cmd_alpha"),
            "profile": ("analysis", "cmd_profile"), "bench": ("bench", "cmd_bench"), "serve": ("serve", "cmd_serve"),
            "ngram": ("fit", "cmd_ngram"), "distill": ("fit", "cmd_distill"), "check": ("check", "cmd_check"),
            "cache": ("cache", "cmd_cache")}

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """`specdecode ARGS`: the command's exit code; a bad option or input is one line on stderr and 2,
    Ctrl-C at any moment one line and 130."""
    try:
        args = build_parser().parse_args(argv)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from ..progress import enable

        enable(sys.stderr.isatty() and not getattr(args, "quiet", False) and not getattr(args, "json", False))
        module, function = COMMANDS[args.command]
        command = getattr(importlib.import_module(f".{module}", __name__), function)
        return command(args)
    except (ValueError, FileNotFoundError, OSError, ImportError) as err:
        print(f"specdecode: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdecode: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
