"""Models of the consolidation app (built by its own issue)."""
