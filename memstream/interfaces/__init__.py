"""Thin shells over the domain, streams and projections: HTTP API and MCP server."""

__all__: list[str] = []
