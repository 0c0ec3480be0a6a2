"""What every provider does alike: usage estimates, tool schemas, and JSON answers checked."""
from __future__ import annotations

import json
import re
from typing import Any

from kinsite.llm.types import (
    LLMBadResponse,
    Message,
    ToolCall,
)
from kinsite.tokencount import count_tokens


def estimate_prompt_tokens(messages: list[Message]) -> int:
    """A usage estimate for endpoints that do not report one."""
    total = 0
    for message in messages:
        total += count_tokens(message.get("content") or "") if isinstance(message.get("content"), str) else 0
        for call in message.get("tool_calls") or []:
            total += count_tokens(call.get("function", {}).get("arguments") or "")
    return total


def estimate_reply_tokens(content: str | None, tool_calls: list[ToolCall]) -> int:
    return count_tokens(content or "") + sum(count_tokens(call.arguments) for call in tool_calls)


def normalize_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accept OpenAI tool dicts or the short {"name", "description", "parameters"} form."""
    normalized = []
    for tool in tools:
        if "function" in tool:
            normalized.append({"type": "function", **tool})
        else:
            normalized.append({"type": "function", "function": tool})
    return normalized


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n?```\s*$", re.DOTALL)


def strip_json_fence(text: str) -> str:
    # Small local models often wrap JSON answers in ```json fences even in JSON mode.
    match = _FENCE.match(text)
    return match.group(1) if match else text


def check_json_answer(content: str | None, *, source: str) -> str:
    """The JSON text of a json_mode answer, or LLMBadResponse when it is not JSON."""
    text = strip_json_fence(content or "")
    try:
        json.loads(text)
    except ValueError as exc:
        snippet = (content or "")[:200]
        raise LLMBadResponse(
            f"{source} was asked for a JSON answer but replied with text that is not JSON: {snippet!r}"
        ) from exc
    return text

