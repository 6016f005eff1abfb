"""The projector service inside the worker: a ``mode`` service with a group-less
consumer that feeds the projector batches and resumes from the positions stored with
the rows (``service``), what it runs on (``runtime``), and ``shard_owner``, the
consumer-group member that projects the shards of the partitions Kafka assigns it."""

from __future__ import annotations

from memstream.services.projector.runtime import apply_decoded
from memstream.services.projector.service import ready_file, register_projector
from memstream.services.projector.shard_owner import register_group_projector

__all__ = [
    "apply_decoded",
    "ready_file",
    "register_group_projector",
    "register_projector",
]
