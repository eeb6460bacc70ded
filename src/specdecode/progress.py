"""What a command is waiting for, on stderr: a spinner naming each wait (building the kernels,
measuring the machine, reading a tokenizer, converting or loading a model) while it lasts, and the
time a one-off step took once it is done, so that no first use sits silent for half a minute.

Off unless a command turns it on (`enable`): the library stays quiet, and so does a command whose
stderr is not a terminal or that was given --quiet."""

from __future__ import annotations

import time
from contextlib import contextmanager

_console = None  # a rich Console on stderr while enabled
_shown: list[str] = []  # the waits in progress, innermost last: one spinner shows the innermost
_spinner = None  # rich's status while one shows


def enable(on: bool = True) -> None:
    global _console
    if on:
        from rich.console import Console

        _console = Console(stderr=True, highlight=False)
    else:
        _console = None


@contextmanager
def waiting(what: str, once: bool = False):
    """Show `what` while the block runs (a wait inside another replaces it on the one spinner until
    it ends); where `once` (a step done once per model and machine, then cached) and it took over
    a second, say how long afterwards."""
    global _spinner
    if _console is None:
        yield
        return
    start = time.perf_counter()
    _shown.append(what)
    try:
        if len(_shown) == 1:
            with _console.status(what + " ...", spinner="dots") as _spinner:
                yield
        else:
            _spinner.update(what + " ...")
            yield
    finally:
        _shown.pop()
        if _shown:
            _spinner.update(_shown[-1] + " ...")
    took = time.perf_counter() - start
    if once and took >= 1.0:
        _console.print(f"{what}: {took:.1f} s (once; cached for next time)", style="dim")
