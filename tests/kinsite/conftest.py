"""The LLM gateway tests use fake_llm and fake_llm_provider from tests/conftest.py."""
