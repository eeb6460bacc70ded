"""Figure-1 style trace (Leviathan et al. 2023): accepted draft tokens green, rejected proposals
red and struck through, the target's corrected or bonus token blue."""

from __future__ import annotations

from rich.text import Text

from .stats import Stats
from .text import TextStep

ACCEPTED = "green"
REJECTED = "red strike"
TARGET = "blue"


def render_step(piece: TextStep, color: bool = True) -> Text:
    """One step as styled text; without color only the output text (no rejected proposals)."""
    if not color:
        return Text(piece.accepted_text + piece.target_text)
    text = Text()
    text.append(piece.accepted_text, style=ACCEPTED)
    if piece.rejected_text:
        text.append(piece.rejected_text, style=REJECTED)
    text.append(piece.target_text, style=TARGET)
    return text


def format_summary(stats: Stats) -> str:
    rate = stats.acceptance_rate
    parts = [
        f"{stats.new_tokens} tokens",
        f"{stats.target_calls} target calls",
        f"{stats.tokens_per_call:.2f} tokens/call",
        f"acceptance {rate:.1%}" if rate is not None else "acceptance n/a",
        f"{stats.tokens_per_second:.1f} tokens/s",
        f"{stats.wall_seconds:.2f} s",
        f"finished: {stats.finish_reason}",
    ]
    return " | ".join(parts)
