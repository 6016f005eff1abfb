"""Conversation-aware reads of the candidates: the turns they were drawn from, their
neighbouring turns in log order, and the speaker and time priors.

Each memory receives a share of the fused score of the memory drawn from the turn
before its source turn (more when that turn asks a question) and of the one after it,
within the session (``memstream.domain.ranking.propagate_context``); memories found
only this way join the candidates when they pass the search's filters."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from memstream.domain.events import Scope
from memstream.domain.ranking import (
    RankingWeights,
    asks_about_conversation,
    asks_for_time,
    is_turn_copy,
    mentions_time,
    named_dates,
    on_named_day,
    prior_factor,
    query_mentions,
    query_names,
    tokens,
)
from memstream.projections.schema import MEMORIES
from memstream.projections.search import queries as q
from memstream.projections.search.reads import Gathered
from memstream.projections.search.results import READ_COLUMNS, rows_of
from memstream.projections.search.turns import Line, SessionMemories, Turn, step
from memstream.projections.search.view import View
from memstream.projections.store import LanceStore, wait

__all__ = ["CandidateTurns", "conversation", "neighbours", "joiner", "priors", "sources"]


def sources(row: Mapping[str, Any]) -> Sequence[str]:
    return row.get("source_message_ids") or ()  # type: ignore[no-any-return]


class CandidateTurns:
    """The source turns of each candidate found among a search's turns, in source
    order, worked out once per candidate: the neighbours and the priors both walk them."""

    __slots__ = ("turns", "_of")

    def __init__(self, turns: Mapping[str, Turn]) -> None:
        self.turns = turns
        self._of: dict[str, list[Turn]] = {}

    def of(self, pk: str, row: Mapping[str, Any]) -> list[Turn]:
        got = self._of.get(pk)
        if got is None:
            found = map(self.turns.get, sources(row))
            got = self._of[pk] = [t for t in found if t is not None]
        return got


def conversation(
    g: Gathered,
) -> tuple[dict[str, Turn], dict[tuple[str | None, int], Line], list[SessionMemories]]:
    """What the conversational ranking sees of the candidates' turns, as the
    sessions' reads would show it: every turn of the candidates' sessions and the
    source turns of the session-less candidates (``message_id -> turn``); their lines
    in log order per session and partition; the memories of those sessions."""
    view = g.view
    turns: dict[str, Turn] = {}
    lines: dict[tuple[str | None, int], Line] = {}
    members: list[SessionMemories] = []
    for s in g.sessions:
        st = view.turns_of(s)
        if st is not None:
            turns.update(st.turns)
            lines.update(st.lines)
        sm = view.memories_of(s)
        if sm is not None:
            members.append(sm)
    extra: dict[tuple[str | None, int], Line] = {}
    for mid in g.loose:
        t = view.turn(mid)
        if isinstance(t, Turn) and mid not in turns:
            turns[mid] = t
            key = t.line_key
            if key not in extra:
                extra[key] = list(lines.get(key, ()))
            extra[key].append((t.offset, mid))
    for key, line in extra.items():
        line.sort()
        lines[key] = line
    return turns, lines, members


def neighbours(
    rows: dict[str, dict[str, Any]],
    src: CandidateTurns,
    lines: Mapping[tuple[str | None, int], Line],
    members: Sequence[SessionMemories],
    scores: Mapping[str, float],
    join: Callable[[list[str]], list[dict[str, Any]]],
) -> tuple[dict[str, str], set[str]]:
    """``(previous, questions)`` for :func:`propagate_context` over the candidates: the
    memory drawn from the turn just before each candidate's first source turn, and the
    candidate each memory drawn from the turn just after a candidate's last source turn
    follows (same space, session and partition, in log order). Memories of the
    sessions (``members``) drawn from those turns join ``rows`` through ``join`` (which
    keeps those that pass the search's filters)."""

    before, after, lasts = _edges(rows, src, lines)
    wanted = {m for m in [*before.values(), *after.values()] if m}
    if members and wanted:
        _join_members(rows, members, wanted, join)
    by_message: dict[str, list[str]] = {}
    for pk, row in rows.items():
        for m in sources(row):
            by_message.setdefault(m, []).append(pk)

    def best(pks: list[str]) -> str:
        return max(pks, key=lambda pk: (scores.get(pk, 0.0), pk))

    previous: dict[str, str] = {}
    for pk, prev_turn in before.items():
        if prev_turn and prev_turn in by_message:
            previous[pk] = best(by_message[prev_turn])
    for pk, next_turn in after.items():
        if not next_turn or next_turn not in by_message:
            continue
        for follower in by_message[next_turn]:
            current = previous.get(follower)
            if current is None or scores.get(pk, 0.0) > scores.get(current, 0.0):
                previous[follower] = pk
    questions = {pk for pk, t in lasts.items() if t.question}
    for pk, row in rows.items():
        if pk not in lasts:
            found = src.of(pk, row)
            if found and max(found, key=_offset).question:
                questions.add(pk)
    return previous, questions


def _offset(t: Turn) -> int:
    return t.offset


def _edges(
    rows: Mapping[str, Mapping[str, Any]], src: CandidateTurns, lines: Mapping[tuple[str | None, int], Line]
) -> tuple[dict[str, str | None], dict[str, str | None], dict[str, Turn]]:
    """Per candidate: the turn before its first source turn, the turn after its last,
    and that last source turn."""
    before: dict[str, str | None] = {}
    after: dict[str, str | None] = {}
    lasts: dict[str, Turn] = {}
    for pk, row in rows.items():
        found = src.of(pk, row)
        if found:
            ordered = sorted(found, key=_offset) if len(found) > 1 else found
            first, last = ordered[0], ordered[-1]
            before[pk] = step(lines.get(first.line_key, ()), first, False)
            after[pk] = step(lines.get(last.line_key, ()), last, True)
            lasts[pk] = last
    return before, after, lasts


def _join_members(
    rows: dict[str, dict[str, Any]],
    members: Sequence[SessionMemories],
    wanted: set[str],
    join: Callable[[list[str]], list[dict[str, Any]]],
) -> None:
    """Add to ``rows`` the sessions' memories drawn from the ``wanted`` turns."""
    known = {r["memory_id"] for r in rows.values()}
    ids: list[str] = []
    for sm in members:
        cited = sm.citing.keys() & wanted
        if cited:
            hit = {i for m in cited for i in sm.citing[m]}
            ids.extend(i for i in sm.memory_ids if i in hit and i not in known)
    for row in join(ids) if ids else ():
        rows.setdefault(row["pk"], row)


def joiner(
    store: LanceStore, scope: Scope, view: View, extra: Sequence[str]
) -> Callable[[list[str]], list[dict[str, Any]]]:
    """How neighbour memories join the candidates: from the view (read with their
    sessions) when the search has no filters; else only those that pass the filters,
    read by id with them (in the order asked)."""

    def from_view(ids: list[str]) -> list[dict[str, Any]]:
        return [row for row in (view.memory(m) for m in ids) if isinstance(row, dict)]

    def filtered(ids: list[str]) -> list[dict[str, Any]]:
        table = wait(q.by_ids(store, MEMORIES, scope, "memory_id", ids, READ_COLUMNS, extra))
        got = {r["memory_id"]: r for r in rows_of(table, scope)}
        return [got[m] for m in ids if m in got]

    return filtered if extra else from_view


@lru_cache(maxsize=65_536)
def _words(text: str) -> tuple[str, ...]:
    # the same candidates come back query after query: each is split once
    return tuple(tokens(text))


def _names_any(text: str, names: set[str]) -> bool:
    """Whether ``text`` names any of ``names`` (whole words, in order)."""
    words = _words(text)
    present = frozenset(words)
    for name in names:
        t = tokens(name)
        if t and t[0] in present and (len(t) == 1 or any(words[i : i + len(t)] == tuple(t) for i in range(len(words)))):
            return True
    return False


def _span(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """A memory's time as a span: its point time, or its range, or when it was written."""
    point = row.get("timestamp")
    if point is not None:
        return point, point
    start, end = row.get("timestamp_start"), row.get("timestamp_end")
    if start is not None or end is not None:
        return start or end, end or start
    return row.get("created_at"), row.get("created_at")


def priors(
    query: str,
    rows: Mapping[str, Mapping[str, Any]],
    src: CandidateTurns,
    w: RankingWeights,
    space_named: frozenset[str] | set[str] = frozenset(),
) -> dict[str, float]:
    """The speaker prior (the query names the source turn's speaker; for a memory not
    drawn from turns, a speaker of the space the query names that the memory names
    too, or a name the query asks about (:func:`query_names`): it is about that person
    as much as the person's turns are), the time prior (the query asks when, the
    memory states a time) and the question penalty (its source turns only ask) of
    each candidate, and the turn prior of a turn memory the query does not ask about
    (:func:`is_turn_copy`, :func:`asks_about_conversation`), where not 1."""
    wants_time = asks_for_time(query)
    days = named_dates(query) if w.date_weight else frozenset()
    spoken: dict[str, set[str]] = {}  # pk -> the speakers of its source turns
    asking: set[str] = set()  # the candidates whose source turns all ask something
    turns: set[str] = set()  # the candidates drawn from turns
    chat: set[str] = set()  # the candidates that are their turn word for word
    small_talk = w.turn_prior < 1.0 and not asks_about_conversation(query)
    for pk, r in rows.items():
        found = src.of(pk, r)
        if not found:
            continue
        turns.add(pk)
        names = {t.speaker for t in found if t.speaker}
        if names:
            spoken[pk] = names
        if all(t.question for t in found):
            asking.add(pk)
        if small_talk and is_turn_copy(r.get("content") or "", ((t.speaker, t.content) for t in found)):
            chat.add(pk)
    # only the candidates' own speakers can match: the query is matched against those few
    named = query_mentions(query, {n for names in spoken.values() for n in names}) | set(space_named)
    about = named | query_names(query) if w.speaker_about else set()
    out: dict[str, float] = {}
    for pk, r in rows.items():
        said = spoken.get(pk)
        if pk in turns:
            speaker_named = bool(said and not named.isdisjoint(said))
        else:
            speaker_named = bool(about and w.speaker_weight and _names_any(r.get("content") or "", about))
        time_match = wants_time and mentions_time(r.get("content") or "")
        on_day = bool(days) and on_named_day(days, *_span(r))
        if not (speaker_named or time_match or pk in asking or pk in chat or on_day):
            continue  # prior_factor is 1.0 exactly
        factor = prior_factor(speaker_named, time_match, w, pk in asking, pk in chat, on_day)
        if factor != 1.0:
            out[pk] = factor
    return out
