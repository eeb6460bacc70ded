"""Prompt sets: Spec-Bench jsonl (first turn of each question), other jsonl, or plain text lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# Spec-Bench reports per task; its MT-Bench categories form the "multi-turn conversation" task.
SPEC_BENCH_TASKS = {
    "writing": "mt_bench", "roleplay": "mt_bench", "reasoning": "mt_bench", "math": "mt_bench",
    "coding": "mt_bench", "extraction": "mt_bench", "stem": "mt_bench", "humanities": "mt_bench",
    "translation": "translation", "summarization": "summarization", "qa": "qa",
    "math_reasoning": "math_reasoning", "rag": "rag",
}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str

    @property
    def task(self) -> str:
        return SPEC_BENCH_TASKS.get(self.category, self.category)


def load_prompts(path: str | Path, categories: Sequence[str] | None = None,
                 per_category: int | None = None) -> list[Prompt]:
    """Read prompts; keep the given categories (or Spec-Bench task names) and at most
    `per_category` of each, in file order."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    if per_category is not None and per_category < 1:
        raise ValueError(f"per-category sample size must be >= 1, got {per_category}")
    prompts = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if path.suffix in (".jsonl", ".json"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
                text = (record.get("turns") or [None])[0] if "turns" in record else record.get("prompt") or record.get("text")
                if not isinstance(text, str) or not text:
                    raise ValueError(f"{path}:{number}: no prompt ('turns', 'prompt' or 'text' field)")
                prompts.append(Prompt(str(record.get("question_id", number)), record.get("category", "default"), text))
            else:
                prompts.append(Prompt(str(number), "default", line))
    if categories:
        known = {p.category for p in prompts} | {p.task for p in prompts}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ValueError(f"unknown categories {unknown}; the file has {sorted(known)}")
        prompts = [p for p in prompts if p.category in categories or p.task in categories]
    if per_category:
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            if counts.get(p.category, 0) < per_category:
                counts[p.category] = counts.get(p.category, 0) + 1
                kept.append(p)
        prompts = kept
    if not prompts:
        raise ValueError(f"no prompts selected from {path}")
    return prompts
