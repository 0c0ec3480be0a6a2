"""Reading server-sent events over real HTTP, event by event as they arrive (Django's test
client reads a streamed body whole, so it cannot show that events come before the end)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class ServerSentEvent:
    event: str
    data: Any
    id: str | None


def sse_events(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """The events of a streamed httpx response, each as soon as its blank line arrives;
    comments (keep-alives) are skipped."""
    event, data, event_id = "message", [], None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield ServerSentEvent(event=event, data=json.loads("\n".join(data)), id=event_id)
            event, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value


def parse_sse(body: bytes) -> list[ServerSentEvent]:
    """The events of a whole SSE body (the test client's streaming_content, joined)."""
    events = []
    for block in body.decode().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            events.append(ServerSentEvent(event=fields.get("event", "message"), data=json.loads(fields["data"]),
                                          id=fields.get("id")))
    return events
