"""The command line: `specdecode generate | info | analyze | alpha | profile | bench | serve | check | ngram
fit | distill`. `parser.py` defines every command's options; each command is a function of the parsed
arguments (`cmd_*` in generate, analysis, bench, fit and serve) that returns the exit code."""

from __future__ import annotations

import os
import sys

from .analysis import cmd_alpha, cmd_analyze, cmd_info, cmd_profile
from .bench import cmd_bench
from .check import cmd_check
from .fit import cmd_distill, cmd_ngram
from .generate import cmd_generate
from .parser import build_parser
from .serve import cmd_serve

COMMANDS = {"generate": cmd_generate, "info": cmd_info, "analyze": cmd_analyze, "alpha": cmd_alpha,
            "profile": cmd_profile, "bench": cmd_bench, "serve": cmd_serve, "ngram": cmd_ngram, "distill": cmd_distill,
            "check": cmd_check}

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """`specdecode ARGS`: the command's exit code; a bad option or input is one line on stderr and 2."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError, OSError, ImportError) as err:
        print(f"specdecode: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
