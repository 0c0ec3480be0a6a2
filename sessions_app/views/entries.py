"""A session's conversation as the dashboard shows it: each message or command with the turn
that answered it, the tool calls folded under the reply, and what to check under a failure."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.conf import settings

from kinsite.models import LLMCall
from sessions_app.models import Event, Session, Turn

# What the conversation lists; tool calls and results are folded under the reply they led to.
CONVERSATION_KINDS = (Event.Kind.MESSAGE, Event.Kind.COMMAND)
TOOL_KINDS = (Event.Kind.TOOL_CALL, Event.Kind.TOOL_RESULT)


@dataclass
class ToolStep:
    """One tool call of a turn and the result the kin got back (None: not stored)."""

    name: str
    arguments: str
    result: str | None = None
    # Introspection only: the outcome of a staged memory write when the run applied it.
    applied: str | None = None


@dataclass
class TurnFailure:
    """What the chat shows under a failed turn's message, to find the cause: the model, the
    endpoint (LLM_BASE_URL only for staff: members never see where the model lives, just the
    path) and the model calls its last attempt made."""

    model: str
    endpoint: str
    calls: list[LLMCall] = field(default_factory=list)
    retryable: bool = True  # not in an archived session (nothing is run there)


@dataclass
class ChatEntry:
    """A message or command event, with the tool steps folded under it and, for a
    user message, the turn that answered it (None for imported messages)."""

    event: Event
    turn: Turn | None = None
    tool_steps: list[ToolStep] = field(default_factory=list)
    failure: TurnFailure | None = None

    @property
    def error(self) -> str:
        return self.turn.error if self.turn is not None and self.turn.status == Turn.Status.FAILED else ""

    @property
    def awaiting_reply(self) -> bool:
        return self.turn is not None and self.turn.status in (Turn.Status.PENDING, Turn.Status.RUNNING)


def pretty_arguments(arguments) -> str:
    if not isinstance(arguments, str):
        return json.dumps(arguments, indent=2, ensure_ascii=False)
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def tool_steps_by_turn(tool_events: list[Event]) -> dict[int, list[ToolStep]]:
    """Tool-call and tool-result events (oldest first) as steps, grouped by turn id."""
    steps: dict[int, list[ToolStep]] = {}
    by_call_id: dict[tuple[int, str], ToolStep] = {}
    for event in tool_events:
        turn_id = event.data.get("turn")
        if event.kind == Event.Kind.TOOL_CALL:
            for call in event.data.get("tool_calls", []):
                step = ToolStep(name=str(call.get("name", "")), arguments=pretty_arguments(call.get("arguments", "")))
                steps.setdefault(turn_id, []).append(step)
                by_call_id[(turn_id, str(call.get("id", "")))] = step
        else:
            step = by_call_id.get((turn_id, str(event.data.get("tool_call_id", ""))))
            if step is not None:
                step.result = event.content
    return steps


def chat_entries(events: list[Event], turn_rows: list[Turn], tool_events: list[Event]) -> list[ChatEntry]:
    """Each event (oldest first) with its turn and tool steps; a turn's steps go under its
    reply, or under the user message while it has none (failed, or still running)."""
    steps = tool_steps_by_turn(tool_events)
    turn_by_message = {turn.user_message_id: turn for turn in turn_rows}
    entries = []
    for event in events:
        turn = turn_by_message.get(event.pk) if event.role == Event.Role.USER else None
        if event.kind == Event.Kind.MESSAGE and event.role == Event.Role.ASSISTANT:
            tool_steps = steps.get(event.data.get("turn"), [])
        elif turn is not None and turn.reply_id is None:
            tool_steps = steps.get(turn.pk, [])
        else:
            tool_steps = []
        entries.append(ChatEntry(event=event, turn=turn, tool_steps=tool_steps))
    return entries


def entries_for(session: Session, events: list[Event], *, staff: bool = False) -> list[ChatEntry]:
    """Two queries whatever the number of events: their turns, and those turns' tool events
    (by the turn id on each, from the oldest event shown, so the scan stays on the session's
    time index); a third when a shown turn failed. `staff`: show them LLM_BASE_URL."""
    if not events:
        return []
    user_ids = [event.pk for event in events if event.role == Event.Role.USER]
    turn_rows = list(Turn.objects.filter(user_message_id__in=user_ids)) if user_ids else []
    turn_ids = {turn.pk for turn in turn_rows}
    turn_ids |= {event.data["turn"] for event in events if isinstance(event.data.get("turn"), int)}
    tool_events = []
    if turn_ids:
        tool_events = list(
            Event.objects.filter(
                session=session, kind__in=TOOL_KINDS, created_at__gte=events[0].created_at,
                data__turn__in=sorted(turn_ids),
            ).order_by("created_at", "id")
        )
    entries = chat_entries(events, turn_rows, tool_events)
    failures = turn_failures(session, [entry.turn for entry in entries if entry.error], staff=staff)
    for entry in entries:
        if entry.error:
            entry.failure = failures.get(entry.turn.pk)
    return entries


# The endpoint a chat turn calls, below LLM_BASE_URL (kinsite.llm.providers).
CHAT_ENDPOINT_PATH = "/chat/completions"
# A failed turn's entry links at most this many of its model calls.
FAILURE_CALLS_SHOWN = 5


def turn_failures(session: Session, failed: list[Turn], *, staff: bool) -> dict[int, TurnFailure]:
    """Each failed turn's TurnFailure by turn id, from one query of the kin's turn calls made
    while they ran (LLMCall rows carry the kin, not the turn: another session's may show)."""
    if not failed:
        return {}
    kin = session.kin
    windows = {turn.pk: (turn.started_at, turn.finished_at) for turn in failed if turn.started_at and turn.finished_at}
    calls: list[LLMCall] = []
    if windows:
        calls = list(
            LLMCall.objects.filter(
                kin=kin, purpose="turn", created_at__gte=min(start for start, _ in windows.values()),
                created_at__lte=max(end for _, end in windows.values()),
            ).order_by("created_at", "id")
        )
    base_url = settings.LLM_BASE_URL.rstrip("/")
    endpoint = (base_url if staff and base_url else "…") + CHAT_ENDPOINT_PATH
    failures = {}
    for turn in failed:
        start, end = windows.get(turn.pk, (None, None))
        own = [call for call in calls if start is not None and start <= call.created_at <= end]
        model = own[-1].model if own else (kin.model or settings.LLM_MODEL)
        failures[turn.pk] = TurnFailure(model=model, endpoint=endpoint, calls=own[-FAILURE_CALLS_SHOWN:],
                                        retryable=session.archived_at is None)
    return failures
