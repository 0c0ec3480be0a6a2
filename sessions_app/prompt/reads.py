"""The prompt's database reads, a fixed number of them (compaction boundary, participants and
counts, the history that fits the budget, relevant memories), handed to the pure builders as
PromptInputs and history entries. Assembly is sessions_app.prompt.assembly.prompt_assemble."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone

from consolidation.selectors import experience_markdown_sql, experience_nested
from kinsite.llm.types import Message, ToolCall
from kinsite.models import Kin
from kinsite.prompt_safety import one_line
from kinsite.rawsql import aware_datetime
from kinsite.tokencount import count_tokens
from memories.search.selectors import memory_search
from sessions_app.models import HISTORY_KINDS, Event, MessageCount, Session, Summary, Turn
from sessions_app.prompt.history import HistoryItem, select_history
from sessions_app.prompt.sections import (
    NAME_MAX_CHARS,
    ConversationState,
    CurrentSource,
    KinIdentity,
    MemoryItem,
    Participant,
    PromptInputs,
)
from workflows.models import Workflow
from workflows.selectors import workflow_canvas

# The most events a prompt's history is chosen from, so the read stays bounded even when
# many near-empty events fit the budget (compaction normally keeps far below this).
HISTORY_MAX_EVENTS = 2_000
# The id given to a message that is previewed but not stored: newer than any row.
PENDING_MESSAGE_ID = 2**63 - 1
UNNAMED_SENDER = "Unnamed user"


class EventRow(NamedTuple):
    """The columns of a stored event that a prompt needs, read as a plain row (Event instances
    for the whole history window are costly); names match Event's, so readers take either."""

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
        # Read as text and parsed on use: the driver's timestamptz loader is slow in
        # Python, and a turn reads only two of them.
        return aware_datetime(self.created_at_text)


class HistoryEntry(NamedTuple):
    """One history item as selected (`item`) with what is sent for it (`message`) and the row
    it came from (`event`; None for a previewed message). One per event of the window."""

    item: HistoryItem
    message: Message
    event: Event | EventRow | None


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
_USER = Event.Role.USER.value
# The shared `data` of message rows, which _history_entries does not read.
_NO_DATA = MappingProxyType({})
# Builds named tuples at C speed, skipping their generated Python __new__: a turn builds
# three per event of its history window.
_new_tuple = tuple.__new__


def _message(role: str, content: str, sender: str) -> Message:
    if role == Event.Role.USER and sender:
        # One line, so a stored name cannot start a line of the message ("Maria]\nSYSTEM: …").
        return {"role": "user", "content": f"[{one_line(sender, NAME_MAX_CHARS)}] {content}"}
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
    message_count: int  # the messages it covers, earlier summaries' included


class SessionExtras(NamedTuple):
    """What a prompt needs beyond the session and kin rows the caller holds, in one row; `counts`
    per (role, sender, platform): message count and newest message time."""

    experience_markdown: str
    parent_name: str | None
    workflow_name: str | None
    summary: Boundary | None
    counts: list[tuple[str, str, str, int, datetime]]


def _counts_sql() -> str:
    """The session's message counters (MessageCount, kept by triggers: a few rows whatever the
    history) as one JSON array, so they travel in the extras' single row."""
    table = MessageCount._meta.db_table
    columns = "c.role, c.sender, c.platform, c.message_count, CAST(c.last_at AS TEXT)"
    if connection.vendor == "postgresql":
        return f"(SELECT json_agg(json_build_array({columns})) FROM {table} c WHERE c.session_id = %s)"
    return f"(SELECT json_group_array(json_array({columns})) FROM {table} c WHERE c.session_id = %s)"


def _session_extras(session: Session) -> SessionExtras:
    """One statement of scalar subqueries on primary keys and small indexes
    (summary_session_newest, the counters' session index), as SQL: through the ORM,
    compiling it cost more per turn than the database spends on it."""
    kin = session.kin
    kin_table, workflow_table = Kin._meta.db_table, Workflow._meta.db_table
    summary_table, event_table = Summary._meta.db_table, Event._meta.db_table
    newest_summary = (f"(SELECT y.id FROM {summary_table} y WHERE y.session_id = %s "
                      f"ORDER BY y.created_at DESC, y.id DESC LIMIT 1)")
    sql = f"""
        SELECT {experience_markdown_sql("%s")},
               (SELECT p.name FROM {kin_table} p WHERE p.id = %s),
               (SELECT w.name FROM {workflow_table} w WHERE w.id = %s),
               {_counts_sql()},
               y.content, y.last_event_id, CAST(e.created_at AS TEXT), y.message_count
        FROM (SELECT 1) one
        LEFT JOIN {summary_table} y ON y.id = {newest_summary}
        LEFT JOIN {event_table} e ON e.id = y.last_event_id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [kin.pk, kin.parent_id, session.workflow_id, session.pk, session.pk])
        (markdown, parent_name, workflow_name, counts,
         content, last_event_id, last_at, message_count) = cursor.fetchone()
    summary = None
    if last_event_id is not None:
        summary = Boundary(content=content, last_event_id=last_event_id, last_at=aware_datetime(last_at),
                           message_count=message_count)
    if isinstance(counts, str):
        counts = json.loads(counts)
    counts = [(role, sender, platform, count, aware_datetime(newest))
              for role, sender, platform, count, newest in counts or ()]
    return SessionExtras(markdown or "", parent_name, workflow_name, summary, counts)


def _canvas(session: Session, workflow_name: str | None) -> str:
    """CURRENT CANVAS of the attached workflow, or "". Its name comes with the
    session extras; the graph is read per turn (three queries whatever its size), never stored."""
    if session.workflow_id is None or workflow_name is None:
        return ""
    workflow = Workflow(pk=session.workflow_id, team_id=session.kin.team_id, name=workflow_name)
    return workflow_canvas(workflow=workflow)


def _boundary_sql(summary: Boundary | None) -> tuple[str, list[Any]]:
    if summary is None:
        return "", []
    at = connection.ops.adapt_datetimefield_value(summary.last_at)
    return " AND (created_at > %s OR (created_at = %s AND id > %s))", [at, at, summary.last_event_id]


def unsummarised_tokens(session_id: int, summary: Boundary | None) -> int:
    """The tokens of the session's history events after `summary`'s boundary, as SQL (through
    the ORM it cost more Python than the database spends on it)."""
    boundary, boundary_params = _boundary_sql(summary)
    kinds = ", ".join(["%s"] * len(HISTORY_KINDS))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT SUM(token_count) FROM {Event._meta.db_table} "
            f"WHERE session_id = %s AND kind IN ({kinds}){boundary}",
            [session_id, *HISTORY_KINDS, *boundary_params],
        )
        return cursor.fetchone()[0] or 0


def _later_posts_sql(session_id: int, turn_id: int | None) -> tuple[str, list[Any]]:
    """Leaves out the messages of turns posted after `turn_id`: a turn answers the conversation
    up to its own message. Turns run in post order, so later turns are all unfinished and the
    subquery reads only those (turn_session_status); it compares event ids, so the cut still
    reads the index alone."""
    if turn_id is None:
        return "", []
    table = Turn._meta.db_table
    return (f" AND id NOT IN (SELECT t.user_message_id FROM {table} t WHERE t.session_id = %s"
            f" AND t.status IN (%s, %s) AND t.id > %s AND t.user_message_id IS NOT NULL)",
            [session_id, Turn.Status.PENDING, Turn.Status.RUNNING, turn_id])


def _history_entries(session_id: int, summary: Boundary | None, budget: int,
                     turn_id: int | None = None) -> dict[int, HistoryEntry]:
    """The history entries the budget could need (the newest events after the boundary), by
    id, oldest first, from one query. The cut comes first, from token counts alone (the
    event_history_tokens index, no table row read): of the newest HISTORY_MAX_EVENTS, every
    event whose newer events alone fit the budget, so also the one that overflows it; only
    those are read whole. For a turn, messages posted after its own are left out."""
    boundary, boundary_params = _boundary_sql(summary)
    later_posts, later_posts_params = _later_posts_sql(session_id, turn_id)
    kinds = ", ".join(["%s"] * len(HISTORY_KINDS))
    scope = f"session_id = %s AND kind IN ({kinds}){boundary}{later_posts}"
    scope_params = [session_id, *HISTORY_KINDS, *boundary_params, *later_posts_params]
    # A message's `data` is never read, so it is not sent.
    sql = f"""
        SELECT id, kind, role, content, sender, platform, token_count,
               CASE WHEN kind = %s THEN NULL ELSE data END, CAST(created_at AS TEXT)
        FROM sessions_app_event e
        WHERE {scope}
        ORDER BY e.created_at DESC, e.id DESC  -- the columns, not the text of created_at selected
        LIMIT (
            SELECT count(*) FROM (
                SELECT token_count, SUM(token_count) OVER (
                    ORDER BY created_at DESC, id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
                ) AS running_tokens
                FROM (
                    SELECT created_at, id, token_count FROM sessions_app_event
                    WHERE {scope}
                    ORDER BY created_at DESC, id DESC
                    LIMIT %s
                ) newest
            ) sums
            WHERE running_tokens - token_count <= %s
        )
    """
    params = [Event.Kind.MESSAGE, *scope_params, *scope_params, HISTORY_MAX_EVENTS, budget]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # Newest first is the order the index gives, so the database does not sort.
    rows.reverse()
    # Hot loop (every event of the window): messages, the common case, are built inline.
    entries = {}
    for pk, kind, role, content, sender, platform, tokens, data, created_at in rows:
        if kind == _MESSAGE:
            event = _new_tuple(EventRow, (pk, kind, role, content, sender, platform, tokens, _NO_DATA, created_at))
            item = _new_tuple(HistoryItem, (pk, role, kind, tokens, None, ()))
            if role == _USER and sender:
                message = {"role": "user", "content": f"[{one_line(sender, NAME_MAX_CHARS)}] {content}"}
            else:
                message = _message(role, content, sender)
            entries[pk] = _new_tuple(HistoryEntry, (item, message, event))
        else:
            data = json.loads(data) if isinstance(data, str) else data
            event = EventRow(pk, kind, role, content, sender, platform, tokens, data, created_at)
            entries[pk] = HistoryEntry(_history_item(event), event_as_message(event), event)
    return entries


def prompt_inputs_for(
    *,
    session: Session,
    message_text: str,
    sender: str,
    platform: str,
    now: datetime | None = None,
    current_event: Event | None = None,
    turn_id: int | None = None,
) -> tuple[PromptInputs, list[HistoryEntry], int, Boundary | None]:
    """The prompt inputs, the selected history (oldest first, ending with the message being
    answered), the history budget and the boundary read, in a fixed number of reads.
    `current_event` is the stored message turn `turn_id` answers; without it a non-empty
    `message_text` is a message about to be sent (the preview), counted as if stored."""
    now = now or timezone.now()
    # The session and kin rows are the caller's; the rest comes in one statement.
    kin = session.kin
    budget = kin.effective_history_budget
    extras = _session_extras(session)
    summary = extras.summary
    counts = extras.counts
    entries = _history_entries(session.pk, summary, budget, turn_id)

    pending = current_event is None and bool(message_text.strip())
    own_rounds: list[HistoryEntry] = []
    if current_event is not None:
        # The message being answered goes last even if earlier turns' replies were stored
        # after it, so the model answers it; only the tool rounds its own stopped attempt
        # stored follow it, kept whatever the budget, as a running turn keeps its rounds.
        entries.pop(current_event.pk, None)
        if turn_id is not None:
            own_rounds = [entry for entry in entries.values()
                          if entry.item.kind != _MESSAGE and entry.event.data.get("turn") == turn_id]
            for entry in own_rounds:
                del entries[entry.item.id]
        entries[current_event.pk] = HistoryEntry(
            _history_item(current_event), event_as_message(current_event), current_event
        )
    elif pending:
        item = HistoryItem(id=PENDING_MESSAGE_ID, role=Event.Role.USER, kind=Event.Kind.MESSAGE,
                           tokens=count_tokens(message_text))
        entries[PENDING_MESSAGE_ID] = HistoryEntry(item, _message(Event.Role.USER, message_text, sender), None)
    selected = select_history([entry.item for entry in entries.values()], budget_tokens=budget)
    history = [entries[item.id] for item in selected] + own_rounds

    participants: dict[tuple[str, str], list] = {}
    total = 0
    for role, name, where, count, last_at in counts:
        total += count
        if role == Event.Role.USER:
            key = (name or UNNAMED_SENDER, where)
            # Messages with no sender and "Unnamed user" are one participant.
            previous_count, previous_at = participants.get(key, [0, last_at])
            participants[key] = [previous_count + count, max(previous_at, last_at)]
    summarised = summary.message_count if summary is not None else 0
    if pending:
        total += 1
        key = (sender or UNNAMED_SENDER, platform)
        count, _ = participants.get(key, [0, None])
        participants[key] = [count + 1, now]
    visible = [entry for entry in history if entry.item.kind == Event.Kind.MESSAGE]
    # Oldest first bar the current message (moved last), so only those two times are parsed.
    stored = [entry.event for entry in visible if entry.event is not None]
    oldest_visible_at = min(
        (event.created_at for event in stored[:1] + stored[-1:]), default=now if visible else None
    )

    memories = []
    if message_text.strip():
        hits = memory_search(team=kin.team, kin=kin, query=message_text)
        memories = [
            MemoryItem(id=hit.memory.pk, category=hit.memory.category, content=hit.memory.content,
                       subject=hit.memory.subject, importance=hit.memory.importance, updated_at=hit.memory.updated_at)
            for hit in hits
        ]

    inputs = PromptInputs(
        identity=KinIdentity(
            name=kin.name, role=kin.role, character=kin.character, expertise=kin.expertise,
            parent_name=extras.parent_name, spawn_reason=kin.spawn_reason,
        ),
        experience_markdown=experience_nested(extras.experience_markdown),
        memories=memories,
        canvas=_canvas(session, extras.workflow_name),
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
        # The team came with the session (every caller reads session → kin → team in one go).
        timezone_name=session.kin.team.zone(default=settings.TIME_ZONE).key,
    )
    return inputs, history, budget, summary
