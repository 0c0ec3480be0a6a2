"""The LLM gateway: providers for chat and embeddings, and the logged entry points."""
