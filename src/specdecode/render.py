"""Figure-1 style trace (Leviathan et al. 2023): accepted draft tokens green, rejected proposals
red and struck through, the target's corrected or bonus token blue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:  # the names only: the early first token renders before the decode loop (and torch) loads
    from .stats import Stats
    from .text import TextStep

ACCEPTED = "green"
REJECTED = "red strike"
TARGET = "blue"


def render_step(piece: TextStep, color: bool = True, show_rejected: bool = False) -> Text:
    """One step as text: the answer's own (accepted draft tokens, then the target's), coloured where
    `color`; the proposals the target rejected only where `show_rejected`, struck through in red with
    colour, between [- and -] without (a terminal without strikethrough, or text copied, still
    reads the answer apart from them)."""
    text = Text()
    text.append(piece.accepted_text, style=ACCEPTED if color else None)
    if show_rejected and piece.rejected_text:
        text.append(piece.rejected_text if color else f"[-{piece.rejected_text}-]", style=REJECTED if color else None)
    text.append(piece.target_text, style=TARGET if color else None)
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


def no_gain(stats: Stats) -> str:
    """Why speculation did not pay in a run: what the draft got accepted, and what drafting cost."""
    if not stats.proposed:
        return ("speculation did not pay here: the draft proposed nothing worth verifying (--gamma auto kept to "
                "plain decoding, or the drafter found nothing to copy); the difference is noise or set-up")
    spent = stats.draft_seconds / stats.wall_seconds if stats.wall_seconds else 0.0
    return (f"speculation did not pay here: the target accepted {stats.acceptance_rate:.0%} of "
            f"{stats.proposed} drafted tokens ({stats.tokens_per_call:.2f} tokens a call), and drafting took "
            f"{spent:.0%} of the time; a draft closer to the target, or a cheaper one, would")
