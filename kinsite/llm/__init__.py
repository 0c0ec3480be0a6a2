"""The LLM gateway (SPEC §10): providers for chat and embeddings, and the logged entry points."""
