"""memstream: long-term memory for fleets of LLM agents.

Immutable events on Kafka are the source of truth; Faust agents project them into
LanceDB tables that agents query with hybrid search under hard tenant isolation.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
