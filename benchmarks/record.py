"""What every benchmark script does with its result: print it, and write it where --out says."""

from __future__ import annotations

import platform
import random
from pathlib import Path

# the Spec-Bench prompt set (480 prompts in 13 categories), beside this checkout
SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def publish(lines: list[str], out: str | Path | None) -> str:
    """The report (lines joined), printed, and written to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return text


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (the platform's processor elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def bootstrap_interval(statistic, n: int, draws: int = 4000) -> tuple[float, float]:
    """A 95% bootstrap interval of `statistic(indices)` over n paired samples (prompts, rounds),
    resampled with replacement, seeded: the same samples give the same interval."""
    rng = random.Random(0)
    values = sorted(statistic(rng.choices(range(n), k=n)) for _ in range(draws))
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]
