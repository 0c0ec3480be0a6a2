"""LLM providers: the interface, the offline stand-in used when no endpoint is configured, and which
provider a call gets (the HTTP client is openai_client.py)."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from django.conf import settings

from kinsite.llm.openai_client import OpenAICompatibleProvider
from kinsite.llm.types import (
    ChatResult,
    DeltaSink,
    EmbeddingResult,
    LLMError,
    Message,
    text_pieces,
)


@runtime_checkable
class LLMProvider(Protocol):
    name: str
    model: str  # the default chat model
    supports_embeddings: bool

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        json_mode: bool = False,
        model: str | None = None,
        temperature: float | None = None,
        on_delta: DeltaSink | None = None,
    ) -> ChatResult: ...
    # on_delta: stream the reply, passing each piece of its text to on_delta as it arrives;
    # the result is the same as without it (the whole content, the tool calls, the usage).

    def embed(self, texts: list[str], *, model: str | None = None) -> list[list[float]]: ...

    # embed() plus the usage and attempts the gateway logs.
    def embed_result(self, texts: list[str], *, model: str | None = None) -> EmbeddingResult: ...



# --- offline stand-in ------------------------------------------------------------------------

OFFLINE_MESSAGE = (
    "No language model is configured for this Kinsite (LLM_BASE_URL is empty), so this is a "
    "placeholder, not a model's answer. Set LLM_BASE_URL (and LLM_API_KEY, LLM_MODEL) to an "
    "OpenAI-compatible endpoint to get real replies."
)


def chat_model_configured() -> bool:
    """Whether chat calls reach a model: False on the offline stand-in (no LLM_BASE_URL).
    Work whose result would be the stand-in's placeholder (introspection, compaction,
    consolidation) checks this first and refuses or skips instead."""
    return not isinstance(get_default_provider(), OfflineProvider)


def model_not_configured_message(work: str) -> str:
    """The refusal for `work` ("Consolidation", ...) when chat_model_configured() is False."""
    return (f"{work} needs a language model, and none is configured: LLM_BASE_URL is empty. Set LLM_BASE_URL "
            f"(and LLM_API_KEY, LLM_MODEL) to an OpenAI-compatible endpoint to enable introspection, compaction, "
            f"consolidation and real chat replies; see docs/getting-started.md, \"What runs without a model\".")


class OfflineProvider:
    """Answers when no endpoint is configured, saying so plainly instead of pretending to think."""

    name = "offline"
    model = "offline"
    supports_embeddings = False

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        json_mode: bool = False,
        model: str | None = None,
        temperature: float | None = None,
        on_delta: DeltaSink | None = None,
    ) -> ChatResult:
        content = json.dumps({"error": OFFLINE_MESSAGE}) if json_mode else OFFLINE_MESSAGE
        if on_delta is not None:
            for piece in text_pieces(content):
                on_delta(piece)
        return ChatResult(
            content=content,
            tool_calls=[],
            model=self.model,
            tokens_in=0,
            tokens_out=0,
            finish_reason="stop",
            raw={},
            attempts=0,  # nothing was sent anywhere
        )

    def embed(self, texts: list[str], *, model: str | None = None) -> list[list[float]]:
        return self.embed_result(texts, model=model).vectors

    def embed_result(self, texts: list[str], *, model: str | None = None) -> EmbeddingResult:
        raise LLMError(
            "No embedding model is configured (LLM_BASE_URL is empty), so texts cannot be embedded. "
            "Set LLM_BASE_URL and LLM_EMBEDDING_MODEL to an OpenAI-compatible endpoint.",
            attempts=0,
        )



# --- choosing the provider -------------------------------------------------------------------

_override: LLMProvider | None = None


@contextlib.contextmanager
def provider_override(provider: LLMProvider) -> Iterator[LLMProvider]:
    """Point every gateway call that does not pass `provider=` at this one (for tests).

    A module global rather than a context variable on purpose: threads the test
    starts (a live server, eager tasks) must see the override too.
    """
    global _override
    previous = _override
    _override = provider
    try:
        yield provider
    finally:
        _override = previous


def get_default_provider() -> LLMProvider:
    if _override is not None:
        return _override
    if not settings.LLM_BASE_URL:
        return OfflineProvider()
    return _openai_provider(
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        settings.LLM_MODEL,
        settings.LLM_EMBEDDING_MODEL,
        settings.LLM_TIMEOUT_SECONDS,
        settings.LLM_MAX_RETRIES,
        settings.LLM_RETRY_BACKOFF_SECONDS,
    )


# Cached by the settings values, so connections are pooled across calls while
# override_settings in tests still gets a provider matching the new values.
@lru_cache(maxsize=8)
def _openai_provider(
    base_url: str, api_key: str, model: str, embedding_model: str, timeout: float, max_retries: int, backoff: float
) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(
        base_url=base_url,
        api_key=api_key,
        model=model,
        embedding_model=embedding_model,
        timeout=timeout,
        max_retries=max_retries,
        backoff=backoff,
    )
