"""Plain data and errors shared by the LLM providers and the gateway."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kinsite.errors import UpstreamError

# Messages are OpenAI-format dicts: {"role", "content"} plus "tool_calls" on
# assistant turns and "tool_call_id" on tool results.
Message = dict[str, Any]

# Called with each piece of a reply's text as the model produces it (a streamed call); the
# pieces, joined, are the reply's content.
DeltaSink = Callable[[str], None]

_PIECES = re.compile(r"\s*\S+|\s+")


def text_pieces(text: str) -> list[str]:
    """A text cut into word-sized pieces that join back into it, for providers that have the
    whole answer at once but are asked to stream it."""
    return _PIECES.findall(text)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON string the model sent; it may be invalid JSON

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ValueError when the model sent something else."""
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError(f"tool arguments are not a JSON object: {self.arguments[:200]}")
        return value

    def as_message_part(self) -> dict[str, Any]:
        """The OpenAI shape used inside an assistant message's "tool_calls"."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ChatResult:
    content: str | None
    tool_calls: list[ToolCall]
    model: str  # the model that was asked for (the endpoint's echo is in raw)
    tokens_in: int
    tokens_out: int
    finish_reason: str | None
    raw: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1  # HTTP attempts it took, retries included

    def json(self) -> Any:
        """The content parsed as JSON (for json_mode answers, already checked by the provider)."""
        return json.loads(self.content or "")

    def as_assistant_message(self) -> Message:
        """This reply as the assistant message to append to the conversation."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.as_message_part() for call in self.tool_calls]
        return message


@dataclass
class EmbeddingResult:
    vectors: list[list[float]]
    model: str
    tokens_in: int
    attempts: int = 1


class LLMError(UpstreamError):
    """A model call failed; `attempts` says how many HTTP attempts were made."""

    code = "llm_error"

    def __init__(self, message: str, *, attempts: int = 1, details: dict | None = None):
        super().__init__(message, details=details)
        self.attempts = attempts


class LLMTimeout(LLMError):
    code = "llm_timeout"


class LLMHTTPError(LLMError):
    code = "llm_http_error"

    def __init__(self, message: str, *, status_code: int, attempts: int = 1, details: dict | None = None):
        super().__init__(message, attempts=attempts, details={"status_code": status_code, **(details or {})})
        self.status_code = status_code


class LLMBadResponse(LLMError):
    """The endpoint answered, but not with something usable (bad body, non-JSON JSON answer)."""

    code = "llm_bad_response"


class LLMStreamInterrupted(LLMError):
    """A streamed answer broke off after part of its text had already gone to the caller; it is
    not retried, because a second answer would repeat or contradict what the caller has shown."""

    code = "llm_stream_interrupted"

    def __init__(self, message: str, *, delivered_chars: int, attempts: int = 1, details: dict | None = None):
        super().__init__(message, attempts=attempts, details={"delivered_chars": delivered_chars, **(details or {})})
        self.delivered_chars = delivered_chars
