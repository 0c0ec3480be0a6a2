"""The prompt preview: exactly what a turn would send for a message, as plain data:
the sections with their token counts, the selected history, the tools and the totals. The
API's GET /sessions/{id}/prompt/ and the MCP server's prompt_preview tool both serve it.
Reading it changes nothing (memories served here do not count as retrieved)."""
from __future__ import annotations

from typing import Any

from sessions_app.models import Session
from sessions_app.prompt.assembly import PENDING_MESSAGE_ID, prompt_assemble
from sessions_app.turns.tools import kin_toolset


def prompt_preview(*, session: Session, message: str, sender: str, platform: str) -> dict[str, Any]:
    prompt = prompt_assemble(session=session, message_text=message, sender=sender, platform=platform)
    history = []
    for entry in prompt.history:
        event = entry.event
        # No event: the previewed message itself, which is not stored.
        history.append({
            "id": entry.item.id if entry.item.id != PENDING_MESSAGE_ID else None,
            "kind": entry.item.kind,
            "role": entry.item.role,
            "sender": event.sender if event is not None else sender,
            "platform": event.platform if event is not None else platform,
            "created_at": event.created_at if event is not None else None,
            "content": event.content if event is not None else message,
            "tokens": entry.item.tokens,
            "sent": entry.message,
        })
    return {
        "sections": [{"id": s.id, "title": s.title, "text": s.text, "tokens": s.tokens} for s in prompt.sections],
        "system_prompt": prompt.messages[0]["content"],
        "history": history,
        "tools": list(kin_toolset(workflow_id=session.workflow_id)),
        "totals": {
            "system_tokens": prompt.system_tokens,
            "history_tokens": prompt.history_tokens,
            "total_tokens": prompt.total_tokens,
            "budget": prompt.budget,
        },
    }
