"""LanceDB: table schemas, the projector, positions, hybrid search, replay, analytics."""

__all__: list[str] = []
