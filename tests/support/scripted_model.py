"""A scripted model provider for unit tests: replays replies in order, records calls, embeds by hashing words."""
from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import time
from typing import Any, NamedTuple

from kinsite.llm.replies import check_json_answer, estimate_prompt_tokens, estimate_reply_tokens
from kinsite.llm.types import (
    ChatResult,
    DeltaSink,
    EmbeddingResult,
    LLMError,
    Message,
    ToolCall,
    text_pieces,
)
from kinsite.tokencount import count_tokens


class RecordedCall(NamedTuple):
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    json_mode: bool
    model: str | None


class ScriptExhausted(LLMError, AssertionError):
    """The code under test made more model calls than the test scripted."""


ScriptItem = str | ChatResult | dict[str, Any] | BaseException
EMBEDDING_DIMENSIONS = 64


class ScriptedProvider:
    """Replays a list of replies in order and records each call; never touches the network.

    Items: a str (plain reply), a ChatResult (returned as is), a dict
    {"tool_calls": [{"name", "arguments": {...}}], "content": optional}, or an
    exception instance (raised). In json_mode a str reply must be JSON, as with a real endpoint.
    A streamed call (on_delta) gets the content in word-sized pieces, `piece_delay` seconds apart.
    """

    name = "scripted"
    supports_embeddings = True

    def __init__(self, script: list[ScriptItem] | None = None, *, model: str = "scripted-model"):
        self.script: list[ScriptItem] = list(script or [])
        self.model = model
        self.calls: list[RecordedCall] = []
        self.embed_calls: list[list[str]] = []
        self.piece_delay = 0.0

    def add(self, *items: ScriptItem) -> None:
        self.script.extend(items)

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
        # Deep copies: callers keep appending to their message list after the call.
        self.calls.append(RecordedCall(copy.deepcopy(messages), copy.deepcopy(tools), json_mode, model))
        if not self.script:
            raise ScriptExhausted(
                f"ScriptedProvider ran out of replies at call {len(self.calls)}: the code under test "
                f"made more model calls than the test scripted. Last message: {_last_content(messages)!r}"
            )
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        result = self._result(item, messages=messages, json_mode=json_mode, model=model or self.model)
        if on_delta is not None:
            for index, piece in enumerate(text_pieces(result.content or "")):
                if index and self.piece_delay:
                    time.sleep(self.piece_delay)
                on_delta(piece)
        return result

    def _result(self, item: ScriptItem, *, messages: list[Message], json_mode: bool, model: str) -> ChatResult:
        if isinstance(item, ChatResult):
            return item
        if isinstance(item, str):
            content: str | None = check_json_answer(item, source="ScriptedProvider") if json_mode else item
            tool_calls: list[ToolCall] = []
        elif isinstance(item, dict):
            content = item.get("content")
            tool_calls = [
                ToolCall(
                    id=call.get("id") or f"call_{len(self.calls)}_{index}",
                    name=call["name"],
                    arguments=call["arguments"] if isinstance(call.get("arguments"), str)
                    else json.dumps(call.get("arguments") or {}),
                )
                for index, call in enumerate(item.get("tool_calls") or [])
            ]
        else:
            raise TypeError(f"ScriptedProvider cannot replay a {type(item).__name__}: {item!r}")
        return ChatResult(
            content=content,
            tool_calls=tool_calls,
            model=model,
            tokens_in=estimate_prompt_tokens(messages),
            tokens_out=estimate_reply_tokens(content, tool_calls),
            finish_reason="tool_calls" if tool_calls else "stop",
            raw={"scripted": True},
            attempts=1,
        )

    def embed(self, texts: list[str], *, model: str | None = None) -> list[list[float]]:
        return self.embed_result(texts, model=model).vectors

    def embed_result(self, texts: list[str], *, model: str | None = None) -> EmbeddingResult:
        self.embed_calls.append(list(texts))
        return EmbeddingResult(
            vectors=[hashed_bag_of_words(text) for text in texts],
            model=model or "scripted-embedding",
            tokens_in=sum(count_tokens(text) for text in texts),
            attempts=1,
        )


def hashed_bag_of_words(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """A deterministic unit vector where texts sharing words point the same way."""
    vector = [0.0] * dimensions
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.md5(word.encode()).digest()
        vector[int.from_bytes(digest[:4], "big") % dimensions] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def _last_content(messages: list[Message]) -> str:
    return str(messages[-1].get("content") or "")[:200] if messages else ""

