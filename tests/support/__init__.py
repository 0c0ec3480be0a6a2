"""Shared test helpers that are not fixtures: the fake OpenAI-compatible server."""
