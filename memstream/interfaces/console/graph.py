"""The links of one memory as a small graph: the memory in the middle, the memories
at the other ends of its links around it (pure layout; the template draws the SVG)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Node", "Edge", "Graph", "link_graph"]

WIDTH = 640
HEIGHT = 360
RADIUS = 140
MAX_NODES = 16
"""More ends than this are listed below the graph, not drawn."""


@dataclass(frozen=True)
class Node:
    memory_id: str
    label: str
    x: float
    y: float
    center: bool = False
    visible: bool = True
    """False when the other end lies outside the read's scope (shown as an id only)."""


@dataclass(frozen=True)
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float
    relation: str
    outgoing: bool


@dataclass(frozen=True)
class Graph:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]


def _label(text: str, limit: int = 28) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def link_graph(
    memory: Mapping[str, Any], ends: Mapping[str, Mapping[str, Any]],
    links_out: Sequence[Mapping[str, Any]], links_in: Sequence[Mapping[str, Any]],
) -> Graph:
    """Place ``memory`` at the centre and the other end of each link on a circle;
    ``ends`` holds the rows the read may see (others are drawn as their id)."""
    cx, cy = WIDTH / 2, HEIGHT / 2
    order: list[str] = []
    for link in (*links_out, *links_in):
        other = link["to_memory_id"] if link["from_memory_id"] == memory["memory_id"] else link["from_memory_id"]
        if other not in order and other != memory["memory_id"]:
            order.append(other)
    order = order[:MAX_NODES]
    nodes = [Node(memory["memory_id"], _label(memory.get("content") or ""), cx, cy, center=True)]
    where: dict[str, tuple[float, float]] = {}
    for i, other in enumerate(order):
        angle = 2 * math.pi * i / max(len(order), 1) - math.pi / 2
        x, y = cx + RADIUS * 1.6 * math.cos(angle), cy + RADIUS * math.sin(angle)
        where[other] = (x, y)
        row = ends.get(other)
        nodes.append(Node(other, _label(row["content"]) if row else other, x, y, visible=row is not None))
    edges = []
    for outgoing, links in ((True, links_out), (False, links_in)):
        for link in links:
            other = link["to_memory_id"] if outgoing else link["from_memory_id"]
            if other in where:
                x, y = where[other]
                x1, y1, x2, y2 = (cx, cy, x, y) if outgoing else (x, y, cx, cy)
                edges.append(Edge(x1, y1, x2, y2, str(link["relation"]), outgoing))
    return Graph(WIDTH, HEIGHT, nodes, edges)
