"""The extraction window: the turns the model reads, gated and given short aliases.

Aliases (``t1``, ``t2``...) cost fewer tokens than UUIDs and are easy to check: a cited
id that is not in the window is dropped, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from memstream.domain.events import MessageObserved, Scope
from memstream.domain.gate.quality import GateResult, gate

__all__ = ["MAX_TURN_CHARS_IN_PROMPT", "WindowTurn", "Window", "build_window", "render_turns"]

MAX_TURN_CHARS_IN_PROMPT = 4_000
"""A turn longer than this is cut in the prompt (the full turn stays in L0): ten turns
of the 32,000-character maximum would not fit a small model's context."""


@dataclass(frozen=True)
class WindowTurn:
    """A qualifying turn as the model sees it: ``alias`` (``t3``) and the gated text."""

    alias: str
    message: MessageObserved
    text: str
    background: bool

    @property
    def message_id(self) -> str:
        return self.message.message_id


@dataclass(frozen=True)
class Window:
    """One extraction's input.

    ``turns`` holds the qualifying turns, background first; ``rejected`` the new turns
    the quality gate kept out (with the verdict, for the run's record); ``new_message_ids``
    every new turn's id, qualifying or not: all of them are consumed by a successful run.
    """

    scope: Scope
    session_id: str | None
    turns: tuple[WindowTurn, ...]
    rejected: tuple[tuple[str, GateResult], ...]
    new_message_ids: tuple[str, ...]

    @property
    def new_turns(self) -> tuple[WindowTurn, ...]:
        return tuple(t for t in self.turns if not t.background)

    @property
    def background_turns(self) -> tuple[WindowTurn, ...]:
        return tuple(t for t in self.turns if t.background)

    @property
    def input_refs(self) -> tuple[str, ...]:
        """The message ids shown to the model (background and new)."""
        return tuple(t.message_id for t in self.turns)

    def resolve(self, ref: Any) -> WindowTurn | None:
        """The turn a cited id points to: an alias (``t3``, ``T3``, ``[t3]``), a bare
        alias number (``3``) or the message id itself; ``None`` for anything else."""
        if isinstance(ref, bool):
            return None
        if isinstance(ref, int):
            ref = f"t{ref}"
        if not isinstance(ref, str):
            return None
        key = ref.strip().strip("[]()").strip()
        by_alias = {t.alias: t for t in self.turns}
        if key.lower() in by_alias:
            return by_alias[key.lower()]
        if key.isdigit() and f"t{int(key)}" in by_alias:
            return by_alias[f"t{int(key)}"]
        for turn in self.turns:
            if turn.message_id == key:
                return turn
        return None


def build_window(
    scope: Scope,
    session_id: str | None,
    new_turns: Sequence[MessageObserved],
    background_turns: Sequence[MessageObserved] = (),
    *,
    max_background: int | None = None,
) -> Window:
    """Gate the turns and number the qualifying ones.

    Background turns that fail the gate are left out silently (they were recorded when
    they were new); at most ``max_background`` of the latest qualifying ones are kept.
    A turn id seen among the new turns is never repeated as background.
    """
    new_ids = {m.message_id for m in new_turns}
    background: list[tuple[MessageObserved, str]] = []
    for message in background_turns:
        if message.message_id in new_ids:
            continue
        verdict = gate(message.content)
        if verdict.passed:
            background.append((message, verdict.text))
    if max_background is not None:
        background = background[-max_background:] if max_background > 0 else []

    turns: list[WindowTurn] = []
    for message, text in background:
        turns.append(WindowTurn(f"t{len(turns) + 1}", message, text, True))
    rejected: list[tuple[str, GateResult]] = []
    seen: set[str] = set()
    for message in new_turns:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        verdict = gate(message.content)
        if verdict.passed:
            turns.append(WindowTurn(f"t{len(turns) + 1}", message, verdict.text, False))
        else:
            rejected.append((message.message_id, verdict))
    new_message_ids = tuple(dict.fromkeys(m.message_id for m in new_turns))
    return Window(scope, session_id, tuple(turns), tuple(rejected), new_message_ids)


def _format_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC (%A)")


def _render_turn(turn: WindowTurn) -> str:
    m = turn.message
    who = m.role if not m.speaker else f"{m.role} {m.speaker}"
    text = turn.text
    if len(text) > MAX_TURN_CHARS_IN_PROMPT:
        text = text[:MAX_TURN_CHARS_IN_PROMPT] + " [...cut]"
    body = text.replace("\r\n", "\n").replace("\n", "\n    ")
    return f"[{turn.alias}] {_format_time(m.occurred_at)} | {who}: {body}"


def render_turns(window: Window) -> tuple[str, str]:
    """``(background, new)`` prompt text: one ``[alias] time | role speaker: text`` line
    per turn (continuation lines indented)."""
    background = "\n".join(_render_turn(t) for t in window.background_turns) or "(none)"
    new = "\n".join(_render_turn(t) for t in window.new_turns) or "(none)"
    return background, new
