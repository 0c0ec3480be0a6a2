"""What a turn's prompt is made of, read from the database a fixed number of times
(SPEC §4, §14): the kin, the compaction boundary, participants and counts, the
history that fits the budget, and the relevant memories. The pure builders in
sessions_app.prompt and sessions_app.history turn that into sections and messages;
the chat turn and the prompt preview both go through `prompt_assemble`, so the
preview is exactly what a turn would send."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from consolidation.selectors import experience_markdown_subquery, experience_nested
from kinsite.llm.types import Message, ToolCall
from kinsite.tokencount import count_tokens
from memories.selectors import memory_search
from sessions_app.history import HistoryItem, select_history
from sessions_app.models import Event, Session, Summary
from sessions_app.prompt import (
    ConversationState,
    CurrentSource,
    KinIdentity,
    MemoryItem,
    Participant,
    PromptInputs,
    Section,
    build_sections,
    render_system_prompt,
    total_tokens,
)
from workflows.selectors import workflow_canvas

HISTORY_KINDS = (Event.Kind.MESSAGE, Event.Kind.TOOL_CALL, Event.Kind.TOOL_RESULT)
# The most events a prompt's history is chosen from, whatever the budget, so reading
# the candidates stays bounded even when many near-empty events fit the token budget
# (compaction normally keeps the un-summarised history far below this).
HISTORY_MAX_EVENTS = 2_000
# The id given to a message that is previewed but not stored: newer than any row.
PENDING_MESSAGE_ID = 2**63 - 1
UNNAMED_SENDER = "Unnamed user"


class EventRow(NamedTuple):
    """The columns of a stored event that a prompt needs. History candidates are read as
    plain rows: building ~700 `Event` instances per turn was a quarter of its time. The
    names match Event's, so code reading an entry's event takes either."""

    pk: int
    kind: str
    role: str
    content: str
    sender: str
    platform: str
    token_count: int
    data: dict
    created_at_text: str

    @property
    def created_at(self) -> datetime:
        # Read as text and parsed on use: the driver's timestamptz loader (Django's, in
        # Python) cost several ms for the ~700 rows of a turn, which reads two of them.
        value = parse_datetime(self.created_at_text)
        if settings.USE_TZ and timezone.is_naive(value):
            value = value.replace(tzinfo=UTC)
        return value


class HistoryEntry(NamedTuple):
    """One history item as selected (`item`) with what is sent for it (`message`) and
    the row it came from (`event`; None for a previewed message that is not stored).
    A named tuple, as HistoryItem: one is made per event of the history window."""

    item: HistoryItem
    message: Message
    event: Event | EventRow | None


@dataclass(frozen=True)
class AssembledPrompt:
    sections: list[Section]
    history: list[HistoryEntry]
    messages: list[Message]  # the system prompt, then the history: what the model receives
    budget: int

    @property
    def system_tokens(self) -> int:
        return total_tokens(self.sections)

    @property
    def history_tokens(self) -> int:
        return sum(entry.item.tokens for entry in self.history)

    @property
    def total_tokens(self) -> int:
        return self.system_tokens + self.history_tokens


def event_as_message(event: Event | EventRow) -> Message:
    """An event in the OpenAI message format. A user message carries its sender's name,
    so the model can tell people apart in a group conversation."""
    if event.kind == Event.Kind.TOOL_CALL:
        calls = [_openai_tool_call(call) for call in event.data.get("tool_calls", [])]
        return {"role": "assistant", "content": event.content or None, "tool_calls": calls}
    if event.kind == Event.Kind.TOOL_RESULT:
        return {"role": "tool", "tool_call_id": event.data.get("tool_call_id", ""), "content": event.content}
    return _message(event.role, event.content, event.sender)


def _openai_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """Tool calls are stored flat, {"id", "name", "arguments"} (what compaction's transcript
    reads); the model gets them in the OpenAI shape."""
    if "function" in call:
        return call
    return ToolCall(id=str(call.get("id", "")), name=str(call.get("name", "")),
                    arguments=str(call.get("arguments") or "{}")).as_message_part()


_MESSAGE = Event.Kind.MESSAGE.value


def _entry(event: EventRow) -> HistoryEntry:
    if event.kind == _MESSAGE:
        # Inlined for the common case: this runs for every event in the history window.
        item = HistoryItem(event.pk, event.role, event.kind, event.token_count)
        return HistoryEntry(item, _message(event.role, event.content, event.sender), event)
    return HistoryEntry(_history_item(event), event_as_message(event), event)


def _message(role: str, content: str, sender: str) -> Message:
    if role == Event.Role.USER and sender:
        return {"role": "user", "content": f"[{sender}] {content}"}
    return {"role": role if role in ("user", "assistant", "system") else "user", "content": content}


def _history_item(event: Event | EventRow) -> HistoryItem:
    if event.kind == Event.Kind.TOOL_CALL:
        ids = tuple(str(call.get("id", "")) for call in event.data.get("tool_calls", []))
        return HistoryItem(id=event.pk, role=event.role, kind=event.kind, tokens=event.token_count, tool_call_ids=ids)
    if event.kind == Event.Kind.TOOL_RESULT:
        return HistoryItem(
            id=event.pk, role=event.role, kind=event.kind, tokens=event.token_count,
            tool_call_id=str(event.data.get("tool_call_id", "")),
        )
    return HistoryItem(id=event.pk, role=event.role, kind=event.kind, tokens=event.token_count)


@dataclass(frozen=True)
class Boundary:
    """The session's newest compaction summary: its text and the last event it covers."""

    content: str
    last_event_id: int
    last_at: datetime


def _with_newest_summary(sessions):
    """Sessions annotated with their newest summary's fields (correlated subqueries on the
    summary_session_newest index), so the session row brings its compaction boundary and
    a turn waits on one query fewer."""
    newest = Summary.objects.filter(session=OuterRef("pk")).order_by("-created_at", "-id")
    return sessions.annotate(
        summary_content=Subquery(newest.values("content")[:1]),
        summary_last_event_id=Subquery(newest.values("last_event_id")[:1]),
        summary_last_at=Subquery(newest.values("last_event__created_at")[:1]),
    )


def _boundary_of(session: Session) -> Boundary | None:
    if session.summary_last_event_id is None:
        return None
    return Boundary(content=session.summary_content, last_event_id=session.summary_last_event_id,
                    last_at=session.summary_last_at)


def _boundary_sql(summary: Boundary | None) -> tuple[str, list[Any]]:
    if summary is None:
        return "", []
    at = connection.ops.adapt_datetimefield_value(summary.last_at)
    return " AND (created_at > %s OR (created_at = %s AND id > %s))", [at, at, summary.last_event_id]


def _candidate_events(session_id: int, summary: Boundary | None, budget: int) -> list[EventRow]:
    """The newest history events after the boundary that the budget could need, oldest
    first, in one query: a running token sum from the newest event back keeps every
    event whose newer events alone are within budget (so the one that overflows it, too)."""
    boundary, boundary_params = _boundary_sql(summary)
    kinds = ", ".join(["%s"] * len(HISTORY_KINDS))
    # A message's `data` is never read, so it is not sent.
    sql = f"""
        SELECT w.id, w.kind, w.role, w.content, w.sender, w.platform, w.token_count,
               CASE WHEN w.kind = %s THEN NULL ELSE w.data END, CAST(w.created_at AS TEXT)
        FROM (
            SELECT r.*, SUM(r.token_count) OVER (
                ORDER BY r.created_at DESC, r.id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
            ) AS running_tokens
            FROM (
                SELECT id, kind, role, content, sender, platform, token_count, data, created_at
                FROM sessions_app_event
                WHERE session_id = %s AND kind IN ({kinds}){boundary}
                ORDER BY created_at DESC, id DESC
                LIMIT %s
            ) r
        ) w
        WHERE w.running_tokens - w.token_count <= %s
        ORDER BY w.created_at DESC, w.id DESC
    """
    params = [Event.Kind.MESSAGE, session_id, *HISTORY_KINDS, *boundary_params, HISTORY_MAX_EVENTS, budget]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # Newest first is the order the window already has, so the database does not sort again.
    rows.reverse()
    return [
        EventRow(pk, kind, role, content, sender, platform, tokens,
                 (json.loads(data) if isinstance(data, str) else data) if data is not None else {}, created_at)
        for pk, kind, role, content, sender, platform, tokens, data, created_at in rows
    ]


def _message_counts(session_id: int, summary: Boundary | None):
    """Per (role, sender, platform): messages, of them summarised, newest time. One
    GROUP BY gives both the participants and the conversation's counts."""
    summarised = Q(pk__in=[])
    if summary is not None:
        at = summary.last_at
        summarised = Q(created_at__lt=at) | Q(created_at=at, pk__lte=summary.last_event_id)
    return (
        Event.objects.filter(session_id=session_id, kind=Event.Kind.MESSAGE)
        .values("role", "sender", "platform")
        .annotate(count=Count("id"), summarised=Count("id", filter=summarised), last_at=Max("created_at"))
        .order_by()
    )


def prompt_inputs_for(
    *,
    session: Session,
    message_text: str,
    sender: str,
    platform: str,
    now: datetime | None = None,
    current_event: Event | None = None,
    count_retrieval: bool = True,
) -> tuple[PromptInputs, list[HistoryEntry], int]:
    """The prompt inputs, the selected history (oldest first, ending with the message
    being answered) and the history budget. `current_event` is the stored message being
    answered; without it a non-empty `message_text` is treated as a message about to be
    sent (the preview), counted as if stored. Reads the database a fixed number of times,
    whatever the length of the history or the number of memories."""
    now = now or timezone.now()
    # The kin's current experience document and the newest summary come with the session
    # row (subqueries), not as queries of their own: a turn's query count is fixed and
    # small (SPEC §14).
    session = _with_newest_summary(
        Session.objects.select_related("kin", "kin__team", "kin__parent", "workflow")
        .annotate(experience_markdown=experience_markdown_subquery("kin_id"))
    ).get(pk=session.pk)
    kin = session.kin
    budget = kin.effective_history_budget
    summary = _boundary_of(session)
    counts = list(_message_counts(session.pk, summary))
    events = _candidate_events(session.pk, summary, budget)

    pending = current_event is None and bool(message_text.strip())
    entries = {event.pk: _entry(event) for event in events}
    if current_event is not None:
        # The message being answered goes last even if other events were stored after it
        # (an async post queued behind a running turn), so the model answers it.
        entries.pop(current_event.pk, None)
        entries[current_event.pk] = HistoryEntry(
            _history_item(current_event), event_as_message(current_event), current_event
        )
    elif pending:
        item = HistoryItem(id=PENDING_MESSAGE_ID, role=Event.Role.USER, kind=Event.Kind.MESSAGE,
                           tokens=count_tokens(message_text))
        entries[PENDING_MESSAGE_ID] = HistoryEntry(item, _message(Event.Role.USER, message_text, sender), None)
    selected = select_history([entry.item for entry in entries.values()], budget_tokens=budget)
    history = [entries[item.id] for item in selected]

    participants: dict[tuple[str, str], list] = {}
    total = summarised = 0
    for row in counts:
        total += row["count"]
        summarised += row["summarised"]
        if row["role"] == Event.Role.USER:
            participants[(row["sender"] or UNNAMED_SENDER, row["platform"])] = [row["count"], row["last_at"]]
    if pending:
        total += 1
        key = (sender or UNNAMED_SENDER, platform)
        count, _ = participants.get(key, [0, None])
        participants[key] = [count + 1, now]
    visible = [entry for entry in history if entry.item.kind == Event.Kind.MESSAGE]
    # History comes oldest first (bar the message being answered, moved last), so the
    # oldest visible message is among the first stored and the current one; only those
    # two times are parsed.
    stored = [entry.event for entry in visible if entry.event is not None]
    oldest_visible_at = min(
        (event.created_at for event in stored[:1] + stored[-1:]), default=now if visible else None
    )

    memories = []
    if message_text.strip():
        hits = memory_search(team=kin.team, kin=kin, query=message_text, count_retrieval=count_retrieval)
        memories = [
            MemoryItem(id=hit.memory.pk, category=hit.memory.category, content=hit.memory.content,
                       subject=hit.memory.subject, importance=hit.memory.importance, updated_at=hit.memory.updated_at)
            for hit in hits
        ]

    inputs = PromptInputs(
        identity=KinIdentity(
            name=kin.name, role=kin.role, character=kin.character, expertise=kin.expertise,
            parent_name=kin.parent.name if kin.parent is not None else None, spawn_reason=kin.spawn_reason,
        ),
        experience_markdown=experience_nested(session.experience_markdown or ""),
        memories=memories,
        # Read per turn (three queries, whatever the workflow's size), never stored.
        canvas=workflow_canvas(workflow=session.workflow) if session.workflow is not None else "",
        participants=[
            Participant(name=name, platform=where, message_count=count, last_active_at=last_at)
            for (name, where), (count, last_at) in sorted(
                participants.items(), key=lambda pair: pair[1][1] or now, reverse=True
            )
        ],
        state=ConversationState(
            visible_messages=len(visible),
            total_messages=total,
            summarised_messages=summarised,
            oldest_visible_at=oldest_visible_at,
            compacted=summary is not None,
        ),
        summary=summary.content if summary is not None else "",
        working_memory=session.working_memory,
        description=session.description,
        source=CurrentSource(platform=platform, sender=sender),
        now=now,
        timezone_name=settings.TIME_ZONE,
    )
    return inputs, history, budget


def prompt_assemble(
    *,
    session: Session,
    message_text: str,
    sender: str = "",
    platform: str = Event.Platform.API,
    now: datetime | None = None,
    current_event: Event | None = None,
    count_retrieval: bool = True,
) -> AssembledPrompt:
    """The prompt a turn sends: sections, the selected history and the messages list."""
    inputs, history, budget = prompt_inputs_for(
        session=session, message_text=message_text, sender=sender, platform=platform, now=now,
        current_event=current_event, count_retrieval=count_retrieval,
    )
    sections = build_sections(inputs, count_tokens=count_tokens)
    messages: list[Message] = [{"role": "system", "content": render_system_prompt(sections)}]
    messages.extend(entry.message for entry in history)
    return AssembledPrompt(sections=sections, history=history, messages=messages, budget=budget)
