"""Benchmarks; each script prints its figures and writes JSON to bench/results/ (see README.md)."""
