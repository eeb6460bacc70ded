import io
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one thread each, and
    os.environ["OMP_NUM_THREADS"] = "1"    # the same for the processes they start (CLI, server)

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "benchmarks"))  # the load-test client


@pytest.fixture(autouse=True)
def _one_thread_for_small_tensors(request):
    """Tests that are not marked slow run toy models over a few tokens: with one thread torch skips
    OpenMP hand-offs that cost more than the work (the whole-sequence tests ran ~2x faster)."""
    if request.node.get_closest_marker("slow") and not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cli(*args) -> SimpleNamespace:
    """`specdecode ARGS` in this process, its exit code, stdout and stderr as `subprocess.run` names
    them: the command as a user runs it, less an interpreter's start-up and PyTorch's import (3-4 s)."""
    from specdecode.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """`cli` as a tuple (exit code, stdout, stderr; argparse's own errors included), for tests that
    hold pytest's capture: what was captured before is dropped, as the command's output is its own."""
    capsys.readouterr()
    result = cli(*args)
    return result.returncode, result.stdout, result.stderr
