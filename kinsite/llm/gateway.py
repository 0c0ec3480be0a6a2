"""The one way the rest of Kinsite calls a model: llm_chat() and llm_embed(), each logged as an LLMCall row."""
from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from kinsite.llm import local_embedder
from kinsite.llm.providers import LLMProvider, get_default_provider
from kinsite.llm.types import ChatResult, DeltaSink, Message
from kinsite.models import Kin, LLMCall, Team


def llm_chat(
    *,
    purpose: str,
    messages: list[Message],
    team: Team | None = None,
    kin: Kin | None = None,
    tools: list[dict[str, Any]] | None = None,
    json_mode: bool = False,
    model: str | None = None,
    temperature: float | None = None,
    provider: LLMProvider | None = None,
    on_delta: DeltaSink | None = None,
) -> ChatResult:
    """A chat completion; writes one LLMCall row whether it succeeds or fails, and re-raises failures.
    With on_delta the reply is streamed: each piece of its text goes to on_delta as it arrives."""
    provider = provider or get_default_provider()
    requested_model = model or (kin.model if kin is not None and kin.model else None)
    started = time.monotonic()
    # Only a streamed call passes on_delta, so a provider written before streaming still works.
    streaming = {"on_delta": on_delta} if on_delta is not None else {}
    try:
        result = provider.chat(
            messages, tools=tools, json_mode=json_mode, model=requested_model, temperature=temperature, **streaming
        )
    except Exception as exc:
        _log_call(
            purpose=purpose, kind="chat", provider=provider, model=requested_model or provider.model,
            team=team, kin=kin, started=started, attempts=getattr(exc, "attempts", 1), error=exc,
        )
        raise
    _log_call(
        purpose=purpose, kind="chat", provider=provider, model=result.model, team=team, kin=kin, started=started,
        attempts=result.attempts, tokens_in=result.tokens_in, tokens_out=result.tokens_out,
    )
    return result


def llm_embed(
    *,
    purpose: str,
    texts: list[str],
    team: Team | None = None,
    kin: Kin | None = None,
    model: str | None = None,
    provider: LLMProvider | None = None,
) -> list[list[float]]:
    """Embeddings for `texts`, in order; logged like llm_chat. kin.model is a chat model, so it is not used here."""
    provider = provider or get_default_provider()
    started = time.monotonic()
    try:
        result = provider.embed_result(texts, model=model)
    except Exception as exc:
        fallback_model = model or getattr(provider, "embedding_model", "") or provider.model
        _log_call(
            purpose=purpose, kind="embedding", provider=provider, model=fallback_model, team=team, kin=kin,
            started=started, attempts=getattr(exc, "attempts", 1), error=exc,
        )
        raise
    _log_call(
        purpose=purpose, kind="embedding", provider=provider, model=result.model, team=team, kin=kin,
        started=started, attempts=result.attempts, tokens_in=result.tokens_in,
    )
    return result.vectors


def embedding_model_current() -> str:
    """The model that makes new vectors, "" when there is none (EMBEDDINGS=off, or an
    endpoint without LLM_EMBEDDING_MODEL): search compares with it, and re-embedding brings
    every vector to it."""
    if settings.EMBEDDINGS == "off":
        return ""
    if settings.EMBEDDINGS == "local":
        return local_embedder.MODEL_NAME
    provider = get_default_provider()
    if not getattr(provider, "supports_embeddings", False):
        return ""
    return endpoint_model_name(provider)


def endpoint_model_name(provider) -> str:
    """The model name an endpoint provider's vectors are recorded with. Vectors of different
    models are not comparable; rows record which model made theirs."""
    return (getattr(provider, "embedding_model", "") or f"{provider.name}-embedding")[:200]


def _log_call(
    *,
    purpose: str,
    kind: str,
    provider: LLMProvider,
    model: str,
    team: Team | None,
    kin: Kin | None,
    started: float,
    attempts: int,
    tokens_in: int = 0,
    tokens_out: int = 0,
    error: BaseException | None = None,
) -> LLMCall:
    # A kin always belongs to a team, so a call made for a kin is counted against that team.
    team_id = team.pk if team is not None else (kin.team_id if kin is not None else None)
    return LLMCall.objects.create(
        team_id=team_id,
        kin_id=kin.pk if kin is not None else None,
        purpose=purpose[:50],
        provider=provider.name[:30],
        model=(model or "")[:200],
        kind=kind,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        latency_ms=round((time.monotonic() - started) * 1000),
        attempts=attempts,
        status=LLMCall.Status.ERROR if error is not None else LLMCall.Status.OK,
        error=(str(error) or type(error).__name__) if error is not None else "",
    )
