"""The prompt of a chat turn: the reads (reads.py), sections (sections.py) and history
(history.py) assembled. The turn and the preview both call `prompt_assemble`, so the preview
is exactly what a turn would send."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kinsite.llm.types import Message
from kinsite.tokencount import count_tokens
from sessions_app.models import Event, Session
from sessions_app.prompt.reads import PENDING_MESSAGE_ID, Boundary, HistoryEntry, prompt_inputs_for
from sessions_app.prompt.sections import Section, build_sections, render_system_prompt, total_tokens

__all__ = ["PENDING_MESSAGE_ID", "AssembledPrompt", "prompt_assemble"]


@dataclass(frozen=True)
class AssembledPrompt:
    sections: list[Section]
    history: list[HistoryEntry]
    messages: list[Message]  # the system prompt, then the history: what the model receives
    budget: int
    memory_ids: list[int]  # the memories in the prompt, best first
    # The compaction boundary the history was read from (the session's newest summary then).
    summary: Boundary | None = None

    @property
    def system_tokens(self) -> int:
        return total_tokens(self.sections)

    @property
    def history_tokens(self) -> int:
        return sum(entry.item.tokens for entry in self.history)

    @property
    def total_tokens(self) -> int:
        return self.system_tokens + self.history_tokens


def prompt_assemble(
    *,
    session: Session,
    message_text: str,
    sender: str = "",
    platform: str = Event.Platform.API,
    now: datetime | None = None,
    current_event: Event | None = None,
    turn_id: int | None = None,
) -> AssembledPrompt:
    """The prompt a turn sends: sections, the selected history and the messages list.
    Only reads: the turn counts the served memories (`memory_ids`) as retrieved when it
    stores its reply, and the preview does not count them."""
    inputs, history, budget, summary = prompt_inputs_for(
        session=session, message_text=message_text, sender=sender, platform=platform, now=now,
        current_event=current_event, turn_id=turn_id,
    )
    sections = build_sections(inputs, count_tokens=count_tokens)
    messages: list[Message] = [{"role": "system", "content": render_system_prompt(sections)}]
    messages.extend(entry.message for entry in history)
    return AssembledPrompt(sections=sections, history=history, messages=messages, budget=budget,
                           memory_ids=[memory.id for memory in inputs.memories], summary=summary)
