"""Memory search: full-text and vector candidates, and the hybrid search over them (selectors.py)."""
