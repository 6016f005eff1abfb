"""LanceDB: table schemas, the projector, positions, hybrid search, replay, analytics."""
