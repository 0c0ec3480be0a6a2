"""Dashboard pages for a session: the chat (post with or without htmx; the reply is
swapped in, with the tool calls that led to it folded underneath), the prompt
preview beside it, and the introspection panel below (working memory, description,
the recent runs and a "Checkpoint now" button). Posting calls sessions_app.turns.services.turn_post,
the preview sessions_app.prompt.assembly.prompt_assemble and the checkpoint
sessions_app.introspection.introspection_request, the same services the API calls. With
JavaScript (kinsite/static/kinsite/chat.js) a post streams instead: session_post_stream
answers the turn's server-sent events (sessions_app.turns.stream, as the API does), with the
entries rendered by the same templates in its `message` and `done` events.
Also: "New session" on a kin's page (any team member), and renaming, archiving and
unarchiving a session (team owners and admins). An archived session's page shows its
history read-only, with "Unarchive" where the chat box was. And the activity pages of a
kin and of the team (sessions_app.activity), which read every app's rows."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta

from django import forms
from django.conf import settings
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse, JsonResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST, require_safe

from kinsite.api.errors import error_body
from kinsite.errors import ServiceUnavailable
from kinsite.models import LLMCall
from kinsite.prompt_safety import one_line_problem
from kinsite.selectors import kin_get
from kinsite.views import can_manage, managers_only, render_partial_or_page, team_required, wants_partial
from sessions_app import activity, selectors, services
from sessions_app.compaction import latest_summary
from sessions_app.forms import SessionCreateForm, SessionRenameForm
from sessions_app.introspection.converse import introspection_settings
from sessions_app.introspection.services import IntrospectionDisabled, introspection_request
from sessions_app.locks import SessionBusy
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.prompt.assembly import prompt_assemble
from sessions_app.turns import services as turns
from sessions_app.turns.stream import turn_event_stream, turn_post_streamed

# The newest page comes first: a chat opens on its latest messages.
MESSAGES_PER_PAGE = 50
# What the conversation lists; tool calls and results are folded under the reply they led to.
CONVERSATION_KINDS = (Event.Kind.MESSAGE, Event.Kind.COMMAND)
TOOL_KINDS = (Event.Kind.TOOL_CALL, Event.Kind.TOOL_RESULT)
# Everything typed in the dashboard is the web platform.
PLATFORM = Event.Platform.WEB
SENDER_MAX_CHARS = Event._meta.get_field("sender").max_length
# The introspection panel lists the newest runs; "Show older runs" adds this many more, up to the maximum.
RUNS_PER_PAGE = 10
RUNS_MAX = 200
# While a run is queued or running the panel refreshes itself (htmx) this often.
RUNS_POLL_SECONDS = 2
# The panel polls only for runs requested this recently: a run left pending (no worker, a lost
# task) is the stalled sweep's to settle, not a reason for every open tab to poll forever.
RUNS_POLL_MAX_AGE = timedelta(minutes=10)


def _one_line(value: str) -> None:
    # The API's rule (sessions_app.api.serializers): a sender is one line in every prompt.
    problem = one_line_problem(value)
    if problem:
        raise forms.ValidationError(f"Sender: {problem}")


class ChatPostForm(forms.Form):
    content = forms.CharField(
        max_length=settings.MESSAGE_MAX_CHARS, strip=False,
        error_messages={"required": "Write a message first."},
    )
    sender = forms.CharField(max_length=SENDER_MAX_CHARS, required=False, validators=[_one_line])

    def clean_content(self):
        content = self.cleaned_data["content"]
        if not content.strip():
            raise forms.ValidationError("Write a message first.")
        return content


class PreviewForm(forms.Form):
    message = forms.CharField(max_length=settings.MESSAGE_MAX_CHARS, required=False, strip=False)
    sender = forms.CharField(max_length=SENDER_MAX_CHARS, required=False, validators=[_one_line])


# --- the conversation, as shown ---------------------------------------------------------------


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
    """What the chat shows under a failed turn's message, to find the cause: the model it
    asked for, the endpoint that failed (its path for members; LLM_BASE_URL itself only for
    staff, who configure it: members never see where the model lives), and the model calls
    its last attempt made (the kin's turn calls logged while it ran)."""

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


def _pretty_arguments(arguments) -> str:
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
                step = ToolStep(name=str(call.get("name", "")), arguments=_pretty_arguments(call.get("arguments", "")))
                steps.setdefault(turn_id, []).append(step)
                by_call_id[(turn_id, str(call.get("id", "")))] = step
        else:
            step = by_call_id.get((turn_id, str(event.data.get("tool_call_id", ""))))
            if step is not None:
                step.result = event.content
    return steps


def chat_entries(events: list[Event], turn_rows: list[Turn], tool_events: list[Event]) -> list[ChatEntry]:
    """The conversation as shown: each event (oldest first) with its turn and tool steps.
    A turn's tool steps go under its reply; under the user message only when the turn
    has no reply (it failed, or is still running)."""
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


def _entries_for(session: Session, events: list[Event], *, staff: bool = False) -> list[ChatEntry]:
    """Two queries whatever the number of events: their turns, and the tool events of
    those turns (found by the turn id stored on each tool event, from the oldest event
    shown on, which keeps the scan on the session's time index); a third when a turn
    shown failed (its model calls, turn_failures). `staff`: show them LLM_BASE_URL."""
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
    """Each failed turn's TurnFailure, by turn id, from one query of the kin's turn model calls
    made while the failed turns ran (LLMCall rows carry the kin, not the turn: a call of
    another session of the kin in the same seconds may be listed too)."""
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


def _session_page(request, chat_session: Session, *, form: ChatPostForm | None = None, error: str = "",
                  checkpoint_error: str = "", rename_form: SessionRenameForm | None = None, status: int = 200):
    events = Event.objects.filter(session=chat_session, kind__in=CONVERSATION_KINDS).order_by("-created_at", "-id")
    paginator = Paginator(events, MESSAGES_PER_PAGE)
    if getattr(chat_session, "event_count", None) is not None:
        # Counted with the session (session_get_with_event_count): that saved query pays for
        # the introspection runs' one, keeping the page within its query budget.
        paginator.count = chat_session.event_count
    page = paginator.get_page(request.GET.get("page") or _page_of_event(chat_session, request.GET.get("event")))
    entries = _entries_for(chat_session, list(reversed(page.object_list)), staff=request.user.is_staff)
    if form is None:
        form = ChatPostForm(initial={"sender": request.user.get_username()})
    context = {
        "chat_session": chat_session,
        "kin": chat_session.kin,
        "page": page,
        "entries": entries,
        "form": form,
        "form_error": error,
        "can_manage": can_manage(request),
        "rename_form": rename_form or SessionRenameForm(session=chat_session),
        **_introspection_context(chat_session, runs_shown=_runs_shown_for_run(request, chat_session),
                                 checkpoint_error=checkpoint_error),
    }
    return render(request, "dashboard/session_detail.html", context, status=status)


def _page_of_event(chat_session: Session, event_id: str | None) -> int:
    """The conversation page holding the event ?event= names (an activity row's link to a
    turn): one query counting the newer events. 1 (the newest) for anything else."""
    if not (event_id or "").isdigit() or len(event_id) > 18:
        return 1
    event = Event.objects.filter(session=chat_session, kind__in=CONVERSATION_KINDS, pk=int(event_id)).values(
        "created_at", "pk").first()
    if event is None:
        return 1
    newer = Event.objects.filter(session=chat_session, kind__in=CONVERSATION_KINDS).filter(
        Q(created_at__gt=event["created_at"]) | Q(created_at=event["created_at"], pk__gt=event["pk"])
    ).count()
    return newer // MESSAGES_PER_PAGE + 1


# --- the introspection panel -------------------------------------------------------------------

# What each memories_touched action did, in the words of the run's end summary.
MEMORY_ACTION_LABELS = {
    "created": "added",
    "merged_with_existing": "merged into existing",
    "updated": "updated",
    "deleted": "deleted",
}


@dataclass
class RunRow:
    """An introspection run as the panel shows it: its tool calls as steps and the
    memories it touched with what it did to each."""

    run: IntrospectionRun
    tool_steps: list[ToolStep]
    memories: list[dict]

    @property
    def duration(self) -> str:
        ms = self.run.duration_ms
        return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"

    @property
    def tokens(self) -> int:
        return self.run.tokens_in + self.run.tokens_out


def run_row(run: IntrospectionRun) -> RunRow:
    steps = []
    for call in run.tool_calls or []:
        if not isinstance(call, dict):
            continue
        result, applied = call.get("result"), call.get("applied")
        steps.append(ToolStep(
            name=str(call.get("name", "")),
            arguments=_pretty_arguments(call.get("arguments", "")),
            result=None if result is None else str(result),
            applied=None if applied is None else str(applied),
        ))
    memories = [
        {"id": item["id"], "action": MEMORY_ACTION_LABELS.get(item.get("action"), str(item.get("action", "")))}
        for item in run.memories_touched or []
        if isinstance(item, dict) and isinstance(item.get("id"), int)
    ]
    return RunRow(run=run, tool_steps=steps, memories=memories)


def _runs_shown(request) -> int:
    try:
        shown = int(request.GET.get("runs", RUNS_PER_PAGE))
    except ValueError:
        shown = RUNS_PER_PAGE  # an old or mistyped link: the default, not an error
    return min(max(shown, RUNS_PER_PAGE), RUNS_MAX)


def _runs_shown_for_run(request, chat_session: Session) -> int:
    """_runs_shown, or with ?run= (an activity row's link to a run) and no ?runs=: enough runs
    to include that one, up to RUNS_MAX. One query counting the newer runs."""
    run_id = request.GET.get("run", "")
    if "runs" in request.GET or not run_id.isdigit() or len(run_id) > 18:
        return _runs_shown(request)
    run = IntrospectionRun.objects.filter(session=chat_session, pk=int(run_id)).values("created_at", "pk").first()
    if run is None:
        return _runs_shown(request)
    newer = selectors.introspection_run_list(session=chat_session).filter(
        Q(created_at__gt=run["created_at"]) | Q(created_at=run["created_at"], pk__gt=run["pk"])
    ).count()
    return min(max(newer + 1, RUNS_PER_PAGE), RUNS_MAX)


def _introspection_context(chat_session: Session, *, runs_shown: int, checkpoint_error: str = "",
                           checkpoint_run: IntrospectionRun | None = None) -> dict:
    """The panel's context: the runs in one query (one row more than shown tells whether
    there are older ones) and the newest compaction summary in another."""
    runs = list(selectors.introspection_run_list(session=chat_session)[: runs_shown + 1])
    more = len(runs) > runs_shown
    runs = runs[:runs_shown]
    active = (IntrospectionRun.Status.PENDING, IntrospectionRun.Status.RUNNING)
    poll_since = timezone.now() - RUNS_POLL_MAX_AGE
    return {
        "runs": [run_row(run) for run in runs],
        "runs_shown": runs_shown,
        "more_runs": runs_shown + RUNS_PER_PAGE if more else None,
        "runs_poll_seconds": RUNS_POLL_SECONDS if any(
            run.status in active and run.created_at >= poll_since for run in runs) else None,
        # The prompt's conversation state starts from the newest compaction summary.
        "summary": latest_summary(chat_session),
        "introspection_enabled": introspection_settings(chat_session.kin).enabled,
        "checkpoint_error": checkpoint_error,
        "checkpoint_run": checkpoint_run,
    }


def _panel_partial(request, chat_session: Session, *, runs_shown: int, checkpoint_error: str = "",
                   checkpoint_run: IntrospectionRun | None = None):
    context = {
        "chat_session": chat_session,
        "kin": chat_session.kin,
        # The partial also refreshes the description under the page title, out of band.
        "oob": True,
        **_introspection_context(chat_session, runs_shown=runs_shown, checkpoint_error=checkpoint_error,
                                 checkpoint_run=checkpoint_run),
    }
    response = render(request, "dashboard/_introspection_panel.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _panel_url(chat_session: Session, runs_shown: int = RUNS_PER_PAGE) -> str:
    url = reverse("dashboard:session_detail", args=[chat_session.pk])
    if runs_shown != RUNS_PER_PAGE:
        url += f"?runs={runs_shown}"
    return url + "#introspection"


# --- views -------------------------------------------------------------------------------------


@require_safe
@team_required
def session_detail(request, session_id: int):
    chat_session = selectors.session_get_with_event_count(team=request.team, session_id=session_id,
                                                          kinds=CONVERSATION_KINDS)
    return _session_page(request, chat_session)


@require_safe
@team_required
def session_introspection(request, session_id: int):
    """The introspection panel alone, for htmx ("Show older runs", and polling while a
    run is queued or running). Without htmx: the session page, at the panel."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    runs_shown = _runs_shown(request)
    if not wants_partial(request):
        return redirect(_panel_url(chat_session, runs_shown))
    return _panel_partial(request, chat_session, runs_shown=runs_shown)


@require_POST
@team_required
def session_checkpoint(request, session_id: int):
    """"Checkpoint now": request an introspection run (trigger checkpoint), as POST
    /api/v1/sessions/{id}/checkpoint/ does. Without htmx: redirect back to the panel (or
    the page with the error, 409, when introspection is off for the kin). With htmx: the
    panel, with the requested run or the error (200: htmx swaps only successful responses)."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    partial = wants_partial(request)
    run, error = None, ""
    try:
        run = introspection_request(session=chat_session, trigger=IntrospectionRun.Trigger.CHECKPOINT)
    except IntrospectionDisabled as exc:
        error = exc.message
    if not partial:
        if error:
            chat_session = selectors.session_get_with_event_count(team=request.team, session_id=session_id,
                                                                  kinds=CONVERSATION_KINDS)
            return _session_page(request, chat_session, checkpoint_error=error, status=409)
        return redirect(_panel_url(chat_session))
    if run is not None:
        # With eager Celery (the embedded default) the run has finished already and may
        # have changed the working memory and the description.
        chat_session.refresh_from_db(fields=["description", "working_memory", "introspection_pending"])
    response = _panel_partial(request, chat_session, runs_shown=RUNS_PER_PAGE, checkpoint_error=error,
                              checkpoint_run=run)
    if run is not None:
        # The prompt preview shows the working memory and the description: it reloads.
        response["HX-Trigger-After-Swap"] = "session-notes-changed"
    return response


@require_POST
@team_required
def session_post(request, session_id: int):
    """One chat turn. Without htmx: redirect back to the session (the reply, or the
    model's error under the message, is on the page). With htmx: 200 and a partial
    that appends the message and its reply (or the error) to the conversation and
    resets the form out of band; a model failure is not an HTTP error here because
    htmx would not swap it in, and the message it concerns is stored either way."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    partial = wants_partial(request)
    form = ChatPostForm(request.POST)
    if not form.is_valid():
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form)
        return _session_page(request, chat_session, form=form, status=400)
    sender = form.cleaned_data["sender"].strip() or request.user.get_username()
    try:
        turn = turns.turn_post(session=chat_session, content=form.cleaned_data["content"], sender=sender,
                               platform=PLATFORM)
    except turns.TurnFailed as exc:
        # The message and the failed turn are stored; the page shows the turn's error.
        turn = Turn.objects.get(pk=exc.details["turn"])
    except services.SessionArchived as exc:
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form, error=exc.message)
        return _session_page(request, chat_session, form=form, error=exc.message, status=409)
    except SessionBusy:
        error = "The kin is still answering an earlier message of this session. Send yours again in a moment."
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form, error=error)
        return _session_page(request, chat_session, form=form, error=error, status=409)
    except ServiceUnavailable as exc:
        # Redis (the session lock) is down: the error says whether the message was stored.
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form, error=exc.message)
        return _session_page(request, chat_session, form=form, error=exc.message, status=503)
    if not partial:
        return redirect(reverse("dashboard:session_detail", args=[chat_session.pk]))
    events = Event.objects.filter(pk__in=[turn.user_message_id, turn.reply_id]).order_by("created_at", "id")
    entries = _entries_for(chat_session, list(events), staff=request.user.is_staff)
    form = ChatPostForm(initial={"sender": sender})
    response = _post_partial(request, chat_session, entries=entries, form=form)
    # After the swap, so the preview reads the emptied message box.
    response["HX-Trigger-After-Swap"] = "chat-posted"
    return response


@require_POST
@team_required
def session_post_stream(request, session_id: int):
    """One chat turn as server-sent events, for chat.js (members chat, as with session_post):
    `message` (the stored message, rendered as the page shows it), then `delta`, `tool_call`
    and `tool_result` as the turn runs, then `done` (the message and its reply rendered, to
    replace what was streamed) or `error` (the §11 shape; the message stays stored). A post
    refused before anything is stored answers JSON in the §11 shape instead: 400 for an
    invalid form, 409 for an archived or busy session, 503 when Redis is down."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    form = ChatPostForm(request.POST)
    if not form.is_valid():
        problems = [str(error) for errors in form.errors.values() for error in errors]
        return _refused("invalid", " ".join(problems), status=400, details={"fields": form.errors.get_json_data()})
    sender = form.cleaned_data["sender"].strip() or request.user.get_username()
    try:
        turn = turn_post_streamed(session=chat_session, content=form.cleaned_data["content"], sender=sender,
                                  platform=PLATFORM)
    except SessionBusy as exc:
        return _refused(exc.code, "The kin is still answering an earlier message of this session. Send yours "
                                  "again in a moment.", status=exc.status)
    except (services.SessionArchived, ServiceUnavailable) as exc:
        return _refused(exc.code, exc.message, status=exc.status, details=exc.details)

    def message_body(message: Event) -> dict:
        # No turn: the "reply is on its way" hint is for pages read without the stream.
        return {"id": message.pk, "html": _entries_html([ChatEntry(event=message)])}

    def done_body(done: Turn) -> dict:
        return {"turn": done.pk, "message": done.user_message_id, "reply": done.reply_id,
                "html": _turn_entries_html(request, chat_session, done)}

    def failed_body(failed: Turn) -> dict:
        # The message with the error, what to check and Retry, as the page shows it.
        return {"html": _turn_entries_html(request, chat_session, failed)}

    return turn_event_stream(request, turn, done_body=done_body, message_body=message_body,
                             failed_body=failed_body)


def _turn_entries_html(request, chat_session: Session, turn: Turn) -> str:
    """The turn's message and reply (or error) as the conversation shows them."""
    events = [event for event in (turn.user_message, turn.reply) if event is not None]
    return _entries_html(_entries_for(chat_session, events, staff=request.user.is_staff), request=request)


def _entries_html(entries: list[ChatEntry], *, request=None) -> str:
    # With the request, for the CSRF token of a failed turn's Retry form.
    return render_to_string("dashboard/_chat_entries.html", {"entries": entries}, request=request)


@require_POST
@team_required
def session_turn_retry(request, session_id: int, turn_id: int):
    """Retry a failed turn (sessions_app.turns.services.turn_retry, as the API's POST /turns/{id}/retry/):
    its stored message is answered again, not posted twice. Without htmx: back to the
    session, at the message. With htmx: the turn's entries, replacing the failed one; a turn
    still running (a worker has it) polls session_turn_entries until it ends. A turn that
    got its reply meanwhile (a second click) just shows it."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    turn = get_object_or_404(Turn.objects.select_related("session"), session=chat_session, pk=turn_id)
    error, status = "", 200
    try:
        turns.turn_retry(turn=turn)
    except turns.TurnNotRetryable:
        pass  # it has its reply (or no message): the entries show what it is
    except (services.SessionArchived, ServiceUnavailable) as exc:
        error, status = exc.message, exc.status
    if not wants_partial(request):
        if error:
            return _session_page(request, chat_session, error=error, status=status)
        page = reverse("dashboard:session_detail", args=[chat_session.pk])
        return redirect(f"{page}?event={turn.user_message_id}#event-{turn.user_message_id}")
    return _turn_entries_response(request, chat_session, turn_id, error=error)


@require_safe
@team_required
def session_turn_entries(request, session_id: int, turn_id: int):
    """The turn's entries (htmx): what a retried turn's entry polls while it runs."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    get_object_or_404(Turn, session=chat_session, pk=turn_id)
    return _turn_entries_response(request, chat_session, turn_id)


def _turn_entries_response(request, chat_session: Session, turn_id: int, *, error: str = "") -> HttpResponse:
    turn = Turn.objects.select_related("user_message", "reply").get(pk=turn_id)
    entries = _entries_for(chat_session, [e for e in (turn.user_message, turn.reply) if e is not None],
                           staff=request.user.is_staff)
    context = {"entries": entries, "chat_session": chat_session, "retry_error": error, "poll_unfinished": True}
    response = render(request, "dashboard/_chat_entries.html", context)
    if turn.status == Turn.Status.DONE:
        response["HX-Trigger-After-Swap"] = "chat-posted"  # the preview and the panel refresh
    return response


def _refused(code: str, message: str, *, status: int, details: dict | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, details), status=status)


def _post_partial(request, chat_session, *, entries, form, error=""):
    context = {"chat_session": chat_session, "entries": entries, "form": form, "form_error": error, "oob": True}
    return render(request, "dashboard/_chat_post.html", context)


@require_safe
@team_required
def session_prompt_preview(request, session_id: int):
    """What a turn would send for the typed text (SPEC §4): the same prompt_assemble a
    turn calls; assembling only reads, so previewing changes nothing."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    form = PreviewForm(request.GET)
    prompt = None
    if form.is_valid():
        message = form.cleaned_data["message"]
        sender = form.cleaned_data["sender"].strip() or request.user.get_username()
        prompt = prompt_assemble(session=chat_session, message_text=message, sender=sender, platform=PLATFORM)
    context = {"chat_session": chat_session, "kin": chat_session.kin, "form": form, "prompt": prompt}
    if prompt is not None:
        context["history_messages"] = sum(1 for entry in prompt.history if entry.item.kind == Event.Kind.MESSAGE)
        context["budget_percent"] = min(100, round(100 * prompt.history_tokens / prompt.budget)) if prompt.budget else 0
    # An invalid partial still answers 200: htmx swaps only successful responses.
    status = 400 if prompt is None and not wants_partial(request) else 200
    return render_partial_or_page(request, partial="dashboard/_prompt_preview.html",
                                  page="dashboard/prompt_preview.html", context=context, status=status)


# --- creating and managing sessions ----------------------------------------------------------


@team_required
def session_create(request, kin_id: int):
    """The "New session" form of a kin: any member of the team may start one (members chat). A
    valid post creates it and goes to its page; an invalid one shows the form again (400)."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    form = SessionCreateForm(request.POST or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        chat_session = services.session_create(kin=kin, **form.validated)
        return redirect("dashboard:session_detail", chat_session.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/session_new.html", {"kin": kin, "form": form}, status=status)


@require_POST
@team_required
def session_rename(request, session_id: int):
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("rename sessions")
    form = SessionRenameForm(request.POST, session=chat_session)
    if not form.is_valid():
        chat_session = selectors.session_get_with_event_count(team=request.team, session_id=session_id,
                                                              kinds=CONVERSATION_KINDS)
        return _session_page(request, chat_session, rename_form=form, status=400)
    services.session_rename(session=chat_session, **form.validated)
    return redirect("dashboard:session_detail", chat_session.pk)


@require_POST
@team_required
def session_archive(request, session_id: int):
    """Archive: hidden from the kin's session list, its page read-only (with "Unarchive")."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("archive sessions")
    services.session_archive(session=chat_session)
    return redirect("dashboard:session_detail", chat_session.pk)


@require_POST
@team_required
def session_unarchive(request, session_id: int):
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("unarchive sessions")
    services.session_unarchive(session=chat_session)
    return redirect("dashboard:session_detail", chat_session.pk)


# --- the activity pages ------------------------------------------------------------------------


def _activity_page(request, scope: activity.Scope, *, template_context: dict):
    """A scope's activity (sessions_app.activity) as filtered by ?kind= (repeatable), ?status=
    (repeatable) and paged by ?cursor=. An unknown value answers 400 with the page saying
    which and what the choices are; nothing is read then."""
    sources = activity.kinds_for(scope)
    known_kinds = [source.kind for source in sources]
    # A value given twice counts once (a kind read twice would list its rows twice).
    kinds = list(dict.fromkeys(kind for kind in request.GET.getlist("kind") if kind))
    statuses = list(dict.fromkeys(status for status in request.GET.getlist("status") if status))
    problems = []
    unknown = [kind for kind in kinds if kind not in known_kinds]
    if unknown:
        problems.append(f"Unknown kind {unknown[0]!r}: this page lists {', '.join(known_kinds)}.")
    unknown = [status for status in statuses if status not in activity.STATUSES]
    if unknown:
        problems.append(f"Unknown status {unknown[0]!r}: choose among {', '.join(activity.STATUSES)}.")
    cursor = None
    if request.GET.get("cursor"):
        try:
            cursor = activity.cursor_decode(request.GET["cursor"])
        except activity.FilterInvalid as exc:
            problems.append(str(exc))
    rows, next_url = [], None
    if not problems:
        page = activity.activity_page(scope=scope, kinds=kinds or known_kinds, statuses=statuses, cursor=cursor,
                                      size=activity.PAGE_SIZE)
        rows = page.rows
        if page.next_cursor:
            params = request.GET.copy()
            params["cursor"] = page.next_cursor
            next_url = "?" + params.urlencode()
    failures = QueryDict(mutable=True)
    failures.setlist("kind", [kind for kind in kinds if kind in known_kinds])
    failures["status"] = activity.FAILED
    context = {
        **template_context,
        "scope": scope,
        "rows": rows,
        "kind_choices": [(source.kind, source.label, source.kind in kinds) for source in sources],
        "status_choices": activity.STATUSES,
        "statuses": statuses,
        "filtered": bool(kinds or statuses),
        "failures_only": statuses == [activity.FAILED],
        "failures_url": "?" + failures.urlencode(),
        "next_url": next_url,
        "paged": cursor is not None,
        "problems": problems,
    }
    return render(request, "dashboard/activity.html", context, status=400 if problems else 200)


@require_safe
@team_required
def kin_activity(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    return _activity_page(request, activity.Scope(team=request.team, kin=kin), template_context={"kin": kin})


@require_safe
@team_required
def team_activity(request):
    return _activity_page(request, activity.Scope(team=request.team), template_context={"kin": None})
