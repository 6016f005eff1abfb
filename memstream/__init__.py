"""memstream: long-term memory for fleets of LLM agents.

Immutable events on Kafka are the source of truth; the worker projects them into
LanceDB tables that agents query with hybrid search under hard tenant isolation.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
