"""A session's page (docs/dashboard.md#chat): the chat (entries.py), the prompt preview beside
it and the introspection panel below (panel.py), through the same services the API calls.
With JavaScript (kinsite/static/kinsite/chat.js) a post streams instead: session_post_stream
answers the turn's server-sent events, the entries rendered by the page's own templates."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from kinsite.api.errors import error_body
from kinsite.errors import ServiceUnavailable
from kinsite.prompt_safety import one_line_problem
from kinsite.views import can_manage, render_partial_or_page, team_required, wants_partial
from sessions_app import selectors, services
from sessions_app.forms import SessionRenameForm
from sessions_app.introspection.services import IntrospectionDisabled, introspection_request
from sessions_app.locks import SessionBusy
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.prompt.assembly import prompt_assemble
from sessions_app.turns import services as turns
from sessions_app.turns.stream import turn_event_stream, turn_post_streamed
from sessions_app.views.entries import CONVERSATION_KINDS, ChatEntry, entries_for
from sessions_app.views.panel import (
    RUNS_PER_PAGE,
    introspection_context,
    panel_partial,
    panel_url,
    runs_to_show,
    runs_to_show_for_run,
)

# The newest page comes first: a chat opens on its latest messages.
MESSAGES_PER_PAGE = 50
PLATFORM = Event.Platform.WEB
SENDER_MAX_CHARS = Event._meta.get_field("sender").max_length


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


def session_page(request, chat_session: Session, *, form: ChatPostForm | None = None, error: str = "",
                 checkpoint_error: str = "", rename_form: SessionRenameForm | None = None, status: int = 200):
    events = Event.objects.filter(session=chat_session, kind__in=CONVERSATION_KINDS).order_by("-created_at", "-id")
    paginator = Paginator(events, MESSAGES_PER_PAGE)
    if getattr(chat_session, "event_count", None) is not None:
        # Counted with the session (session_get_with_event_count): that saved query pays for
        # the introspection runs' one, keeping the page within its query budget.
        paginator.count = chat_session.event_count
    page = paginator.get_page(request.GET.get("page") or _page_of_event(chat_session, request.GET.get("event")))
    entries = entries_for(chat_session, list(reversed(page.object_list)), staff=request.user.is_staff)
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
        **introspection_context(chat_session, runs_shown=runs_to_show_for_run(request, chat_session),
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


@require_safe
@team_required
def session_detail(request, session_id: int):
    chat_session = selectors.session_get_with_event_count(team=request.team, session_id=session_id,
                                                          kinds=CONVERSATION_KINDS)
    return session_page(request, chat_session)


@require_safe
@team_required
def session_introspection(request, session_id: int):
    """The introspection panel alone, for htmx ("Show older runs", and polling while a
    run is queued or running). Without htmx: the session page, at the panel."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    runs_shown = runs_to_show(request)
    if not wants_partial(request):
        return redirect(panel_url(chat_session, runs_shown))
    return panel_partial(request, chat_session, runs_shown=runs_shown)


@require_POST
@team_required
def session_checkpoint(request, session_id: int):
    """"Checkpoint now": request an introspection run, as the API's checkpoint does. Without
    htmx: back to the panel (or the page with the error, 409). With htmx: the panel with the
    run or the error (200: htmx swaps only successful responses)."""
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
            return session_page(request, chat_session, checkpoint_error=error, status=409)
        return redirect(panel_url(chat_session))
    if run is not None:
        # With eager Celery (the embedded default) the run has finished already and may
        # have changed the working memory and the description.
        chat_session.refresh_from_db(fields=["description", "working_memory", "introspection_pending"])
    response = panel_partial(request, chat_session, runs_shown=RUNS_PER_PAGE, checkpoint_error=error,
                             checkpoint_run=run)
    if run is not None:
        # The prompt preview shows the working memory and the description: it reloads.
        response["HX-Trigger-After-Swap"] = "session-notes-changed"
    return response


@require_POST
@team_required
def session_post(request, session_id: int):
    """One chat turn. Without htmx: redirect back to the session. With htmx: 200 and a partial
    appending the message and its reply (or the error) and resetting the form out of band; a
    model failure is not an HTTP error, which htmx would not swap in (the message is stored)."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    partial = wants_partial(request)
    form = ChatPostForm(request.POST)
    if not form.is_valid():
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form)
        return session_page(request, chat_session, form=form, status=400)
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
        return session_page(request, chat_session, form=form, error=exc.message, status=409)
    except SessionBusy:
        error = "The kin is still answering an earlier message of this session. Send yours again in a moment."
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form, error=error)
        return session_page(request, chat_session, form=form, error=error, status=409)
    except ServiceUnavailable as exc:
        # Redis (the session lock) is down: the error says whether the message was stored.
        if partial:
            return _post_partial(request, chat_session, entries=[], form=form, error=exc.message)
        return session_page(request, chat_session, form=form, error=exc.message, status=503)
    if not partial:
        return redirect(reverse("dashboard:session_detail", args=[chat_session.pk]))
    events = Event.objects.filter(pk__in=[turn.user_message_id, turn.reply_id]).order_by("created_at", "id")
    entries = entries_for(chat_session, list(events), staff=request.user.is_staff)
    form = ChatPostForm(initial={"sender": sender})
    response = _post_partial(request, chat_session, entries=entries, form=form)
    # After the swap, so the preview reads the emptied message box.
    response["HX-Trigger-After-Swap"] = "chat-posted"
    return response


@require_POST
@team_required
def session_post_stream(request, session_id: int):
    """One chat turn as server-sent events for chat.js, as the API streams them, with `message`,
    `done` and `error` carrying rendered entries. A post refused before anything is stored
    answers the JSON error shape instead: 400 invalid, 409 archived or busy, 503 Redis down."""
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
    return _entries_html(entries_for(chat_session, events, staff=request.user.is_staff), request=request)


def _entries_html(entries: list[ChatEntry], *, request=None) -> str:
    # With the request, for the CSRF token of a failed turn's Retry form.
    return render_to_string("dashboard/_chat_entries.html", {"entries": entries}, request=request)


@require_POST
@team_required
def session_turn_retry(request, session_id: int, turn_id: int):
    """Retry a failed turn (turns.turn_retry, as the API's retry): its stored message is answered
    again, not posted twice. Without htmx: back to the session, at the message. With htmx: the
    turn's entries, replacing the failed one; a turn still running polls session_turn_entries."""
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
            return session_page(request, chat_session, error=error, status=status)
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
    entries = entries_for(chat_session, [e for e in (turn.user_message, turn.reply) if e is not None],
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
    """What a turn would send for the typed text: the same prompt_assemble a
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
