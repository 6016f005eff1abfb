"""Events to rows: the :class:`Projector` folds each batch of the log into the
tables with its positions (``projector``), ``rows`` is the one map from an event to its
rows, ``plan_writer`` writes a batch's plan and derives the view from links,
``sharded`` runs one projector per shard and ``forget`` deletes a forgotten subject
down to the files on disk."""

from __future__ import annotations

from memstream.projections.projector.forget import SCOPED_TABLES, subject_where
from memstream.projections.projector.projector import Projector
from memstream.projections.projector.rows import decision_update, reflection_row
from memstream.projections.projector.sharded import ShardedProjector

__all__ = [
    "Projector",
    "SCOPED_TABLES",
    "ShardedProjector",
    "decision_update",
    "reflection_row",
    "subject_where",
]
