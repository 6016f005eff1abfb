"""How returns and long texts are worded in reflections and prompts."""

from __future__ import annotations

__all__ = ["pct", "snippet"]


def pct(x: float) -> str:
    """A return as a signed percentage with one decimal (``+1.5%``)."""
    return f"{x * 100:+.1f}%"


def snippet(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1].rsplit(" ", 1)[0] or flat[: limit - 1]
    return cut.rstrip(" ,;:.") + "\u2026"
