"""Ids derived from content, and exact dedup."""

from __future__ import annotations

import hashlib

from memstream.domain.content import content_hash
from memstream.domain.events import LinkRelation, Scope
from memstream.domain.extraction.dedup import content_memory_id, dedupe_batch, link_id_for, memory_id_for, split_known
from tests.domain.extraction.helpers import SCOPE, draft

KEY = b"k" * 32


def test_memory_ids_depend_on_the_space_and_the_normalised_content() -> None:
    a = memory_id_for(SCOPE, content_hash("Ana likes tea."), KEY)
    assert a == memory_id_for(SCOPE, content_hash("ANA  likes tea."), KEY)
    # two agents of one user never share a memory id (a write of one can never replace
    # the other's row)
    other = memory_id_for(Scope(team_id="acme", user_id="ana", agent_id="other"), content_hash("Ana likes tea."), KEY)
    assert other != a
    assert other != memory_id_for(Scope(team_id="acme", user_id="ana", agent_id="third"), content_hash("Ana likes tea."), KEY)
    assert a != memory_id_for(Scope(team_id="acme", user_id="bob"), content_hash("Ana likes tea."), KEY)
    assert a != memory_id_for(SCOPE, content_hash("Ana likes tea"), KEY)
    assert a.startswith("mem-") and len(a) == 36
    # keyed: without the worker's key nobody computes the id another agent's next
    # memory will get (the plain hash of team, user, agent and content was guessable)
    assert a != memory_id_for(SCOPE, content_hash("Ana likes tea."), b"another key" * 3)
    guessed = hashlib.sha256("\x1f".join([SCOPE.team_id, SCOPE.user_id, SCOPE.agent_id, content_hash("Ana likes tea.")]).encode())
    assert a != "mem-" + guessed.hexdigest()[:32]
    assert link_id_for("a", "b", LinkRelation.supersedes) != link_id_for("b", "a", LinkRelation.supersedes)


def test_dedupe_within_a_batch_merges_sources_and_keeps_the_highest_priority() -> None:
    kept, issues = dedupe_batch(
        [draft("Ana likes tea.", ("m0",), 40), draft("Bo likes rum."), draft("ana LIKES tea.", ("m1",), 90)]
    )
    assert [d.content for d in kept] == ["Ana likes tea.", "Bo likes rum."]
    assert kept[0].source_message_ids == ("m0", "m1") and kept[0].priority == 90
    assert [i.kind for i in issues] == ["duplicate_in_batch"]


def test_split_known_against_the_space() -> None:
    tea, rum = draft("Ana likes tea."), draft("Bo likes rum.")
    new, dups = split_known([tea, rum], {content_hash("ana likes tea."): "mem-old"})
    assert new == [rum]
    assert dups == [(tea, "mem-old")]


def test_a_client_memory_id_follows_from_content_and_exact_scope() -> None:
    key = b"k" * 32
    ana = Scope(team_id="acme", user_id="ana")
    first = content_memory_id(ana, "Ana prefers window seats", key)
    assert content_memory_id(ana, "  Ana prefers window seats ", key) == first  # normalised content
    assert content_memory_id(ana.model_copy(update={"agent_id": "bot"}), "Ana prefers window seats", key) != first
    assert content_memory_id(ana, "Ana prefers aisle seats", key) != first
    assert content_memory_id(ana, "Ana prefers window seats", b"o" * 32) != first  # keyed: no client computes it
