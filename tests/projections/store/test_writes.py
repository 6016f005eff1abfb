"""The projector's writes (``memstream.projections.store.writes``): appends for new keys,
merges for known ones, and a first write that loads nothing."""

from __future__ import annotations

from pathlib import Path

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.store.lance_store import LanceStore
from tests.projections.projection_helpers import DIM, memory, positioned

_FIRST_WRITE = """
import sys, tempfile
from pathlib import Path
from tests.projections.projection_helpers import DIM, memory, positioned
from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore
projector = Projector(LanceStore(Path(tempfile.mkdtemp()), embedding_dim=DIM), LocalEmbedder(DIM))
before = set(sys.modules)
projector.apply(positioned([memory(Scope(team_id="t", user_id="u"), "m1", "Alice likes tea")]))
print(sorted(set(sys.modules) - before))
"""


def test_new_keys_are_appended_known_ones_merged(tmp_path: Path) -> None:
    """Rows of unseen keys take the cheap append; a key the table holds (even one
    written before the store was reopened) is updated in place, never duplicated."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    alice = Scope(team_id="acme", user_id="alice")
    projector.apply(positioned([memory(alice, f"m{i}", f"fact number {i}") for i in range(5)]))
    assert store.count(MEMORIES) == 5
    reopened = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    again = Projector(reopened, LocalEmbedder(DIM))
    batch = positioned(
        [memory(alice, "m2", "fact number two, restated"), memory(alice, "m9", "a new fact")], start=5
    )
    result = again.apply(batch)
    assert result.applied == 2
    assert reopened.count(MEMORIES) == 6
    assert reopened.get_memories(alice, ["m2"])[0]["content"] == "fact number two, restated"
    # the same upsert twice (a crash before the positions were saved) adds nothing
    rows = reopened.table(MEMORIES).to_arrow()
    assert reopened.upsert(MEMORIES, rows) == (0, 6)
    assert reopened.count(MEMORIES) == 6
    for name in (MEMORIES, MESSAGES, ENTITIES):
        pks = reopened.table(name).to_arrow().column("pk").to_pylist()
        assert len(pks) == len(set(pks))


def test_the_first_write_imports_nothing() -> None:
    """What the first batch would load on its way is loaded when the writer starts
    (``prepare_writes``), in a fresh interpreter as the worker is."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _FIRST_WRITE], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
