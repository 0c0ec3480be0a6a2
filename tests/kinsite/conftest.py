"""Fixtures for the LLM gateway tests: a running fake OpenAI-compatible server and a provider pointed at it."""
from collections.abc import Iterator

import pytest

from kinsite.llm.providers import OpenAICompatibleProvider
from tests.support.fake_openai import FakeOpenAIServer, fake_openai_server


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    yield from fake_openai_server()


@pytest.fixture
def fake_llm_provider(fake_llm: FakeOpenAIServer) -> Iterator[OpenAICompatibleProvider]:
    """The real HTTP provider against the fake server, with limits small enough for fast tests."""
    provider = OpenAICompatibleProvider(
        base_url=fake_llm.base_url,
        api_key="test-key",
        model="fake-model",
        embedding_model="fake-embedding",
        timeout=0.3,
        max_retries=2,
        backoff=0.01,
    )
    yield provider
    provider.close()
