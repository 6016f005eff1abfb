"""The link graph's layout: the memory in the middle, each other end once on a
circle, an edge per link in its direction, ends the read cannot see drawn as ids."""

from __future__ import annotations

import math

from memstream.interfaces.console.graph import MAX_NODES, link_graph


def _link(a: str, b: str, relation: str = "supersedes") -> dict[str, str]:
    return {"from_memory_id": a, "to_memory_id": b, "relation": relation}


def test_each_end_once_and_edges_in_their_direction() -> None:
    me = {"memory_id": "m", "content": "lives in Lisbon"}
    out = [_link("m", "a"), _link("m", "b", "contradicts")]
    inc = [_link("c", "m", "continues"), _link("a", "m", "entity")]
    g = link_graph(me, {"a": {"content": "lives in Porto"}, "c": {"content": "x"}}, out, inc)
    assert [n.memory_id for n in g.nodes] == ["m", "a", "b", "c"]
    centre, *ends = g.nodes
    assert centre.center and (centre.x, centre.y) == (g.width / 2, g.height / 2)
    assert all(not n.center and math.hypot(n.x - centre.x, n.y - centre.y) > 50 for n in ends)
    assert {n.memory_id: n.visible for n in ends} == {"a": True, "b": False, "c": True}
    assert [n.label for n in ends][1] == "b"  # an end outside the read: its id, never its text
    assert [(e.relation, e.outgoing) for e in g.edges] == [
        ("supersedes", True), ("contradicts", True), ("continues", False), ("entity", False)]
    first = g.edges[0]
    assert (first.x1, first.y1) == (centre.x, centre.y)  # outgoing: from the centre
    assert (g.edges[2].x2, g.edges[2].y2) == (centre.x, centre.y)  # incoming: to it


def test_long_labels_are_cut_and_many_ends_capped() -> None:
    me = {"memory_id": "m", "content": "word " * 40}
    out = [_link("m", f"e{i}") for i in range(MAX_NODES + 5)]
    g = link_graph(me, {}, out, [])
    assert len(g.nodes) == MAX_NODES + 1 and len(g.edges) == MAX_NODES
    assert len(g.nodes[0].label) <= 28 and g.nodes[0].label.endswith("\u2026")


def test_a_memory_without_links_is_a_lone_node() -> None:
    g = link_graph({"memory_id": "m", "content": "alone"}, {}, [], [])
    assert len(g.nodes) == 1 and g.edges == []
