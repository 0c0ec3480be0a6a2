"""Workflow node types: one module per family on a small base (base.py), and their registry (registry.py)."""
