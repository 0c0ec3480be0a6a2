"""Models of the memories app (built by its own issue)."""
