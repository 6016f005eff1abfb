"""The package's layers, read from the source with ``ast`` (nothing is imported).

Groups are the repository's package folders: ``domain/``, ``streams/``,
``projections/``, and ``memstream/`` split into its subfolders (``memstream/services``,
``memstream/interfaces``, ...) and its own files (``memstream``: settings, llm,
metrics, ...). Dependencies point inward, from the interfaces down to the domain:

    domain <- memstream (settings, llm, metrics...) <- streams (Kafka), projections (LanceDB)
           <- memstream/services <- memstream/interfaces, memstream/sdk <- memstream/cli

The same rules as ``layers-check``: no cycle between groups, no function-level import
of a memstream module outside the CLI (such an import is how a cycle hides), and no
package module over 600 lines. A new group must be given its layer in :data:`LAYERS`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "memstream": "memstream",
    "domain": "domain",
    "streams": "streams",
    "projections": "projections",
    "bench": "bench",
}
"""Import name under ``memstream.`` -> folder in the repository (pyproject's package-dir)."""

LAYERS: dict[str, int] = {
    "domain": 0,
    "memstream/settings": 1,
    "memstream": 2,
    "memstream/codec": 3,
    "memstream/sealing": 3,
    "memstream/llm": 3,
    "streams": 4,
    "projections": 4,
    "memstream/services": 5,
    "memstream/interfaces": 6,
    "memstream/sdk": 6,
    "memstream/cli": 7,
    "bench": 8,
}
"""A group may import groups of a lower layer only (same layer: neither imports the
other, so streams and projections stay independent)."""

MAX_LINES = 600
KAFKA_CLIENTS = {"AIOKafkaConsumer", "AIOKafkaProducer", "AIOKafkaAdminClient"}
"""The aiokafka client classes: only ``streams/`` builds them, through the factories
of ``streams/clients.py``, which apply the broker's address and security to each."""
KAFKA_CLIENT_ALIASES = {"KafkaConsumer", "KafkaProducer", "KafkaAdmin"}
"""The names ``streams/clients.py`` gives them for annotations: not to be called."""
RAW_KAFKA_ALLOWED = {"streams", "bench"}
"""``bench/`` measures raw aiokafka ceilings and forges records no memstream client writes."""
LAZY_IMPORTS_ALLOWED = {"memstream/cli"}
"""The CLI imports what a command needs when it runs, so ``memstream --help`` stays fast."""


@dataclass(frozen=True)
class Import:
    path: str
    line: int
    module: str
    top_level: bool


def _group_of_path(rel: Path) -> str:
    parts = rel.parts
    if parts[0] == "memstream" and len(parts) > 2:
        return "memstream/" + parts[1]
    return parts[0]


def _group_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "memstream":
        return None
    if len(parts) == 1:
        return "memstream"
    if parts[1] in PACKAGE_DIRS and parts[1] != "memstream":
        return parts[1]
    if (ROOT / "memstream" / parts[1]).is_dir():
        return "memstream/" + parts[1]
    return "memstream"


def _modules() -> list[Path]:
    out: list[Path] = []
    for folder in PACKAGE_DIRS.values():
        out.extend(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(out)


def _imports(path: Path, root: Path = ROOT) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[int] = set()
    for node in tree.body:  # module level, including under `if TYPE_CHECKING:` and `try:`
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                top.add(id(sub))
    rel = str(path.relative_to(root))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found.extend(Import(rel, node.lineno, m, id(node) in top) for m in names if m.split(".")[0] == "memstream")
    return found


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importing group, imported group) -> where, for module-level imports across groups."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in _modules():
        if path.name == "__main__.py":
            continue
        group = _group_of_path(path.relative_to(ROOT))
        for imp in _imports(path):
            target = _group_of_module(imp.module)
            if imp.top_level and target is not None and target != group:
                edges.setdefault((group, target), []).append(f"{imp.path}:{imp.line} {imp.module}")
    return edges


def _cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found: list[list[str]] = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append(path + [nxt])
            elif nxt not in path and nxt > start:  # each cycle once, from its least group
                walk(start, nxt, path + [nxt])

    for group in sorted(graph):
        walk(group, group, [group])
    return found


def test_the_groups_are_found() -> None:
    """The scan sees the package (a broken walk would pass every other test)."""
    groups = {_group_of_path(p.relative_to(ROOT)) for p in _modules()}
    assert {"domain", "streams", "projections", "memstream", "memstream/services", "memstream/cli"} <= groups
    assert _edges(), "no import between groups found"


def test_every_group_has_a_layer() -> None:
    groups = {_group_of_path(p.relative_to(ROOT)) for p in _modules()}
    missing = sorted(groups - LAYERS.keys())
    assert not missing, f"give these groups a layer in tests/test_architecture.py LAYERS: {missing}"


def test_no_cycle_between_groups() -> None:
    edges = _edges()
    cycles = _cycles(edges)
    detail = []
    for cycle in cycles:
        detail.append(" -> ".join(cycle))
        detail.extend(f"    {where}" for a, b in zip(cycle, cycle[1:]) for where in edges[(a, b)][:3])
    assert not cycles, "import cycles between groups:\n" + "\n".join(detail)


def _outward(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [
        f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}): {', '.join(where[:3])}"
        for (a, b), where in sorted(edges.items())
        if a in LAYERS and b in LAYERS and LAYERS[b] >= LAYERS[a]
    ]


def test_dependencies_point_inward() -> None:
    """A group imports only groups of a lower layer: this fails on the first edge that
    would close a cycle, before the cycle exists."""
    wrong = _outward(_edges())
    assert not wrong, "imports that point outward:\n" + "\n".join(wrong)


def test_no_function_level_import_of_memstream_outside_the_cli() -> None:
    lazy = [
        f"{imp.path}:{imp.line} {imp.module}"
        for path in _modules()
        if _group_of_path(path.relative_to(ROOT)) not in LAZY_IMPORTS_ALLOWED
        for imp in _imports(path)
        if not imp.top_level
    ]
    assert not lazy, "function-level imports (import at module level; a cycle means a layer is wrong):\n" + "\n".join(
        lazy
    )


def test_no_module_over_600_lines() -> None:
    big = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in _modules()
        if (n := p.read_text(encoding="utf-8").count("\n") + 1) > MAX_LINES
    ]
    assert not big, f"modules over {MAX_LINES} lines:\n" + "\n".join(big)


def _raw_kafka_clients(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` imports, names or builds an aiokafka client class itself (or
    calls one of the annotation aliases), rather than through a streams factory."""
    rel = str(path.relative_to(root))
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiokafka":
            found.extend(f"{rel}:{node.lineno} imports {a.name}" for a in node.names if a.name in KAFKA_CLIENTS)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in KAFKA_CLIENTS:
                found.append(f"{rel}:{node.lineno} names {name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in KAFKA_CLIENT_ALIASES:
                found.append(f"{rel}:{node.lineno} builds {name}")
    return found


def test_only_streams_builds_kafka_clients() -> None:
    """streams/ owns Kafka: every consumer, producer and admin client comes from its
    factories, so none can be built without the broker's SASL/TLS settings."""
    raw = [
        where
        for path in _modules()
        if _group_of_path(path.relative_to(ROOT)) not in RAW_KAFKA_ALLOWED
        for where in _raw_kafka_clients(path)
    ]
    assert not raw, "Kafka clients built outside streams/ (use memstream.streams.clients):\n" + "\n".join(raw)


def test_the_rules_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks themselves: a cycle, an outward edge, a lazy import and a Kafka
    client built by hand are found."""
    edges = {("streams", "projections"): ["a"], ("projections", "streams"): ["b"], ("domain", "streams"): ["c"]}
    assert _cycles(edges) == [["projections", "streams", "projections"]]
    outward = _outward({**edges, ("memstream/services", "streams"): ["d"]})
    assert [line.split(" (")[0] for line in outward] == ["domain", "projections", "streams"]
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from memstream.settings import Settings\n"
        "def f():\n    from memstream.streams import topics\n"
    )
    found = {(i.module, i.top_level) for i in _imports(module, tmp_path)}
    assert found == {("memstream.settings", True), ("memstream.streams", False)}
    client = tmp_path / "c.py"
    client.write_text(
        "import aiokafka\nfrom aiokafka.admin import AIOKafkaAdminClient, NewTopic\n"
        "from memstream.streams.clients import KafkaConsumer, create_consumer\n"
        "def f(c: KafkaConsumer):\n    aiokafka.AIOKafkaProducer()\n    KafkaConsumer()\n    create_consumer()\n"
    )
    assert sorted(w.split(" ", 1)[1] for w in _raw_kafka_clients(client, tmp_path)) == [
        "builds KafkaConsumer", "imports AIOKafkaAdminClient", "names AIOKafkaProducer"
    ]

