"""What a claimed turn does: answer a command (/checkpoint, /new) or converse with the model,
running its tool calls (tools.py) and storing each tool round as it happens, then the reply."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from kinsite.actors import writer_ref
from kinsite.llm.gateway import llm_chat
from kinsite.llm.types import ToolCall
from kinsite.tokencount import count_tokens
from kinsite.tools import Tool, ToolContext
from memories.models import Memory
from memories.services import Actor, memories_mark_retrieved
from sessions_app.introspection.services import IntrospectionDisabled, introspection_request
from sessions_app.locks import SessionLock
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.prompt.assembly import AssembledPrompt, prompt_assemble
from sessions_app.turns.events import DELTA, TOOL_CALL, TOOL_RESULT, turn_event_publish
from sessions_app.turns.tools import kin_toolset

logger = logging.getLogger(__name__)


COMMANDS = ("checkpoint", "new")


# A tool's answer is cut to this many characters before it goes back to the model.
TOOL_RESULT_MAX_CHARS = 16_000



@dataclass(frozen=True)
class Command:
    name: str  # "checkpoint" or "new"
    argument: str  # the text after the command word



def command_parse(content: str) -> Command | None:
    """`/checkpoint [note]` or `/new [title]` (any case) as the message's first word; else None."""
    words = content.strip().split(maxsplit=1)
    if not words or not words[0].startswith("/"):
        return None
    name = words[0][1:].lower()
    if name not in COMMANDS:
        return None
    return Command(name=name, argument=words[1].strip() if len(words) > 1 else "")



def command_answer(*, turn: Turn, session: Session, message: Event) -> None:
    """Hand a command to introspection and answer it with a short system reply; /new also
    starts a new session for the same kin and participants."""
    command = command_parse(message.content)
    with transaction.atomic():
        data = {"command": command.name, "reply_to": message.pk}
        # The run starts after this transaction commits (its task is enqueued on commit).
        run = _introspection_request(session=session, trigger=command.name)
        data["introspection_run_id"] = run.pk if run is not None else None
        queued = (
            f"Introspection run {run.pk} will distil it into memories, working memory and a description."
            if run is not None else "Introspection is disabled for this kin, so nothing is distilled."
        )
        if command.name == "new":
            from sessions_app.services import session_continue

            new_session = session_continue(session=session, title=command.argument[:200], command=message)
            data["new_session_id"] = new_session.pk
            Event.objects.filter(pk=message.pk).update(data={**message.data, "new_session_id": new_session.pk})
            text = (
                f"Started a new session (id {new_session.pk}) with {session.kin.name}. "
                f"This session stays as it is; post to the new one to continue there. {queued}"
            )
        else:
            text = f"Checkpoint recorded (event {message.pk}). {queued}"
        reply = Event.objects.create(
            session=session, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content=text,
            platform=message.platform, token_count=count_tokens(text), data=data,
        )
        turn.reply = reply
        turn.status = Turn.Status.DONE
        turn.started_at = turn.started_at or timezone.now()
        turn.finished_at = timezone.now()
        turn.save(update_fields=["reply", "status", "started_at", "finished_at"])



def _introspection_request(*, session: Session, trigger: str) -> IntrospectionRun | None:
    try:
        return introspection_request(session=session, trigger=trigger)
    except IntrospectionDisabled:
        return None



def turn_converse(*, turn: Turn, session: Session, message: Event, lock: SessionLock) -> AssembledPrompt:
    """The model/tool loop. At most KIN_MAX_TOOL_CALLS tool calls run; once they are
    used up the model is called without tools, so it has to answer. Returns the prompt."""
    kin = session.kin
    prompt = prompt_assemble(
        session=session, message_text=message.content, sender=message.sender, platform=message.platform,
        current_event=message, turn_id=turn.pk,
    )
    # Stored with the turn's next write (a tool round, the reply, or the failure), not on its own.
    turn.prompt_tokens = prompt.total_tokens
    messages = list(prompt.messages)
    tools = kin_toolset(workflow_id=session.workflow_id)
    schemas = [tool.schema for tool in tools.values()]
    tool_context = ToolContext(
        team=kin.team, kin=kin, actor=Actor(label=f"kin:{kin.pk} turn:{turn.pk}"),
        source=Memory.Source.TURN, source_ref=writer_ref("event", message.pk),
    )
    max_calls = settings.KIN_MAX_TOOL_CALLS
    capped = max_calls <= 0
    while True:
        lock.refresh()
        offer_tools = not capped
        result = llm_chat(purpose="turn", messages=messages, team=kin.team, kin=kin,
                          tools=schemas if offer_tools else None,
                          on_delta=lambda text: turn_event_publish(turn, DELTA, {"text": text}))
        turn.tokens_in += result.tokens_in
        turn.tokens_out += result.tokens_out
        if not offer_tools or not result.tool_calls:
            break
        outputs = []
        for call in result.tool_calls:
            turn_event_publish(turn, TOOL_CALL, {"id": call.id, "name": call.name, "arguments": call.arguments})
            if turn.tool_calls >= max_calls:
                # Every call in the assistant message needs a result, or the next request is invalid.
                output = (f"Error: not run: the limit of {max_calls} tool calls for this turn is reached. "
                          "Answer with what you have.")
            else:
                turn.tool_calls += 1
                output = _tool_run(tools, call, tool_context)
            outputs.append(output)
            turn_event_publish(turn, TOOL_RESULT, {"id": call.id, "name": call.name, "content": output})
        capped = turn.tool_calls >= max_calls
        _tool_round_store(session=session, turn=turn, content=result.content, calls=result.tool_calls,
                          outputs=outputs, platform=message.platform)
        messages.append(result.as_assistant_message())
        messages.extend(
            {"role": "tool", "tool_call_id": call.id, "content": output}
            for call, output in zip(result.tool_calls, outputs, strict=True)  # one output per call
        )

    text = result.content or ""
    if not text.strip() and capped:
        text = f"I reached the limit of {max_calls} tool calls for this turn before I could finish."
    now = timezone.now()
    with transaction.atomic():
        reply = Event.objects.create(
            session=session, kind=Event.Kind.MESSAGE, role=Event.Role.ASSISTANT, content=text, sender=kin.name,
            platform=message.platform, token_count=count_tokens(text), created_at=now,
            data={"turn": turn.pk, "tool_calls": turn.tool_calls, "tool_call_limit_reached": capped},
        )
        turn.reply = reply
        turn.status = Turn.Status.DONE
        turn.finished_at = now
        turn.error = ""
        turn.save(update_fields=[
            "reply", "status", "finished_at", "error", "tool_calls", "prompt_tokens", "tokens_in", "tokens_out",
        ])
        # Assembling the prompt only reads; the memories it carried count as retrieved with
        # the reply they served, in its transaction (no commit of their own).
        memories_mark_retrieved(memory_ids=prompt.memory_ids, now=now)
        # A completed turn: counted towards introspection's turn_interval trigger.
        Session.objects.filter(pk=session.pk).update(
            last_activity_at=now, introspection_pending=True,
            turns_since_introspection=F("turns_since_introspection") + 1,
        )
    return prompt



def _tool_run(tools: dict[str, Tool], call: ToolCall, tool_context: ToolContext) -> str:
    """The text answer of one tool call; unknown tools and failures become error text."""
    tool = tools.get(call.name)
    if tool is None:
        return f"Error: unknown tool {call.name!r}; available tools: {', '.join(tools)}."
    try:
        # A savepoint, so a tool that fails half-way leaves no partial writes behind.
        with transaction.atomic():
            output = tool.handler(tool_context, call.arguments)
    except Exception as exc:
        logger.exception("Tool %s failed in a turn of kin %s", call.name, tool_context.kin.pk)
        return f"Error: {call.name} failed ({type(exc).__name__}). Try other arguments or answer without it."
    if len(output) > TOOL_RESULT_MAX_CHARS:
        output = output[:TOOL_RESULT_MAX_CHARS] + "… (cut)"
    return output



def _tool_round_store(*, session: Session, turn: Turn, content: str | None, calls: list[ToolCall],
                      outputs: list[str], platform: str) -> None:
    """One assistant tool-call event and its results, committed together."""
    kin = session.kin
    stored_calls = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in calls]
    with transaction.atomic():
        Event.objects.create(
            session=session, kind=Event.Kind.TOOL_CALL, role=Event.Role.ASSISTANT, content=content or "",
            sender=kin.name, platform=platform,
            token_count=count_tokens(content or "") + sum(count_tokens(json.dumps(call)) for call in stored_calls),
            data={"tool_calls": stored_calls, "turn": turn.pk},
        )
        for call, output in zip(calls, outputs, strict=True):
            Event.objects.create(
                session=session, kind=Event.Kind.TOOL_RESULT, role=Event.Role.TOOL, content=output,
                platform=platform, token_count=count_tokens(output),
                data={"tool_call_id": call.id, "name": call.name, "turn": turn.pk},
            )
        Turn.objects.filter(pk=turn.pk).update(
            tool_calls=turn.tool_calls, prompt_tokens=turn.prompt_tokens, tokens_in=turn.tokens_in,
            tokens_out=turn.tokens_out,
        )
