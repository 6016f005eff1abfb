"""The pure core: event models, hashing, dedup and link rules, ranking, reflection rules.

No Kafka, no LanceDB, no network in this package.
"""

from memstream.domain.events import *  # noqa: F401,F403
from memstream.domain.events import __all__ as _events_all

__all__ = list(_events_all)
