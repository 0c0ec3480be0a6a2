"""Models of the workflows app (built by its own issue)."""
