"""The README's examples run as written: every Python block (the client example against a server
started here, on a free port in place of 8000), the custom drafter through `check`, and the quick
shell commands. `make demo` and `make test` are what CI itself runs; the `serve` lines start servers
(the server tests run those)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def python(code: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_the_readme_has_the_blocks_these_tests_run():
    assert len(blocks("python")) >= 4 and any("generate" in b for b in blocks("bash"))


def test_the_readme_is_short_and_each_speed_claim_names_its_results_file():
    """At most 350 lines; a paragraph, list item or table row that claims a speed (a ratio, tokens/s,
    a time) names the file under benchmarks/results/ that measured it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    pieces = [item for paragraph in re.split(r"\n\s*\n", prose) for item in re.split(r"\n(?=\s*[-*] |\|)", paragraph)]
    claim = re.compile(r"\d(\.\d+)?x\b|\d+(\.\d+)? tokens/s|\d+(\.\d+)? ?ms\b| \d+(\.\d+)? s\b")
    unsourced = [piece for piece in pieces if claim.search(piece) and "benchmarks/results/" not in piece]
    assert not unsourced, unsourced
    assert claim.search("ran at 1.18x plain") and claim.search("146 tokens/s")  # the pattern sees claims


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_block_runs_as_written(index, tmp_path):
    code = blocks("python")[index]
    if "OpenAI(" in code:  # a client: against a server of the embedded model, on a free port
        from test_server import _start_server, _stop

        base, process = _start_server()
        try:
            result = python(code.replace("http://127.0.0.1:8000", base), tmp_path)
        finally:
            _stop(process)
    elif code.startswith("# repeat.py"):  # a drafter of one's own: saved as the README says, then proved, on
        (tmp_path / "repeat.py").write_text(code)  # fewer samples and prompts than check's defaults (as test_check)
        result = subprocess.run([sys.executable, "-m", "specdecode", "check", "--draft", "repeat:RepeatLast",
                                 "--samples", "1000", "--num-prompts", "4"],
                                capture_output=True, text=True, timeout=600, cwd=tmp_path)
    else:
        result = python(code, tmp_path)
    assert result.returncode == 0, (code, result.stdout[-3000:], result.stderr[-3000:])
    assert result.stdout.strip(), code  # every example prints something


@pytest.mark.slow
def test_the_quick_shell_commands_run_as_written(tmp_path):
    root = README.parent
    for block in blocks("bash"):
        for line in block.strip().splitlines():
            command = line.split("#")[0].strip()
            if not command.startswith(".venv/bin/specdecode") or " serve" in command:
                continue
            result = subprocess.run(command.replace(".venv/bin/specdecode", f"{sys.executable} -m specdecode", 1),
                                    shell=True, capture_output=True, text=True, timeout=600, cwd=root)
            assert result.returncode == 0 and result.stdout.strip(), (command, result.stderr[-3000:])
