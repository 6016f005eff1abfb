"""Benchmarks: `memstream bench NAME`."""
