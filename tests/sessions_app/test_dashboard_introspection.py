"""The introspection panel of the session page through Django's test client: the
description and working memory, whether introspection is pending, "Checkpoint now"
(with and without htmx, through the same service as the API), the recent runs with
what each changed, older runs, team scoping, escaping and query counts."""
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from memories.models import Memory
from sessions_app.models import IntrospectionRun, Session
from tests.factories import IntrospectionRunFactory, KinFactory, MemoryFactory, MessageFactory, SessionFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


@pytest.fixture
def scripted():
    with provider_override(ScriptedProvider()) as provider:
        yield provider


# Real commits, so that the run enqueued after commit executes inside the request (eager
# Celery, the embedded default), as on a running server.
runs_in_the_request = pytest.mark.django_db(transaction=True)


def page_url(session, **params):
    url = reverse("dashboard:session_detail", args=[session.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def checkpoint_url(session):
    return reverse("dashboard:session_checkpoint", args=[session.pk])


def panel_url(session):
    return reverse("dashboard:session_introspection", args=[session.pk])


def say(session, content, sender="Maria"):
    event = MessageFactory(session=session, content=content, sender=sender)
    Session.objects.filter(pk=session.pk).update(introspection_pending=True)
    return event


def make_run(session, **fields):
    fields.setdefault("trigger", IntrospectionRun.Trigger.TURNS)
    fields.setdefault("status", IntrospectionRun.Status.DONE)
    if fields["status"] not in (IntrospectionRun.Status.PENDING, IntrospectionRun.Status.RUNNING):
        fields.setdefault("finished_at", timezone.now())
    return IntrospectionRunFactory(session=session, **fields)


def panel_of(body: str) -> str:
    return re.search(r'<section id="introspection".*?</section>', body, re.S).group(0)


def run_ids(body: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'id="introspection-run-(\d+)"', body)]


# --- reading ------------------------------------------------------------------------------------


def test_page_shows_description_working_memory_and_pending_state(logged_in, chat_session):
    Session.objects.filter(pk=chat_session.pk).update(
        description="Churn report, EMEA section", working_memory="Goal: EMEA by Friday.\nOpen: dedup rule.",
        introspection_pending=True,
    )

    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())

    assert 'data-field="description">Churn report, EMEA section<' in panel
    assert 'data-field="working_memory">Goal: EMEA by Friday.\nOpen: dedup rule.<' in panel
    assert 'data-pending="true"' in panel and "Introspection pending" in panel
    assert "No introspection runs yet." in panel
    assert f'action="{checkpoint_url(chat_session)}"' in panel and "Checkpoint now</button>" in panel
    # Nothing queued: the panel does not poll; it refreshes after each chat turn (chat.js's chat-posted).
    assert 'hx-trigger="chat-posted from:body"' in panel.split("<div", 1)[0]
    assert 'data-polling="false"' in panel and "every 2s" not in panel


def test_empty_notes_say_so(logged_in, chat_session):
    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())

    assert "No description yet." in panel and "The working memory is empty." in panel
    assert 'data-pending="false"' in panel


def test_runs_show_what_each_changed_newest_first(logged_in, chat_session):
    kin = chat_session.kin
    memory = MemoryFactory(kin=kin, content="The churn report dedups by customer id.")
    older = make_run(chat_session, trigger="idle", summary="Nothing worth storing.", event_count=1,
                     duration_ms=420, tokens_in=300, tokens_out=12)
    newer = make_run(
        chat_session, trigger="checkpoint", event_count=3, first_event_id=11, last_event_id=13,
        duration_ms=2500, tokens_in=1200, tokens_out=80,
        summary=f"Introspection added 1 memory (#{memory.pk}); updated the working memory.",
        tool_calls=[
            {"name": "memory_add", "arguments": {"content": "The churn report dedups by customer id."},
             "result": '{"status": "staged"}', "applied": '{"status": "created"}'},
            {"name": "working_memory_update", "arguments": {"content": "Goal: EMEA."}, "result": "Updated."},
        ],
        memories_touched=[{"id": memory.pk, "action": "created"}],
    )
    failed = make_run(chat_session, trigger="turns", status="failed",
                      error="LLMHTTPError: The endpoint answered 503.")

    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())

    assert run_ids(panel) == [failed.pk, newer.pk, older.pk]
    def start(run):
        return panel.index(f'id="introspection-run-{run.pk}"')

    newer_block = panel[start(newer):start(older)]
    assert "Checkpoint" in newer_block and "Done" in newer_block
    assert "3 events read (#11–#13)" in newer_block
    assert "2.5 s" in newer_block and "1,280 tokens" in newer_block
    assert "updated the working memory." in newer_block
    memory_url = reverse("dashboard:memory_detail", args=[kin.pk, memory.pk])
    assert f'<a href="{memory_url}">Memory #{memory.pk}</a> added' in newer_block
    assert '<details class="tool-calls">' in newer_block
    assert "2 tool calls: memory_add, working_memory_update" in newer_block
    assert "&quot;content&quot;: &quot;The churn report dedups by customer id.&quot;" in newer_block
    assert "&quot;status&quot;: &quot;created&quot;" in newer_block  # what was applied
    older_block = panel[start(older):]
    assert "Idle" in older_block and "1 event read" in older_block and "420 ms" in older_block
    assert "Nothing worth storing." in older_block and "tool-calls" not in older_block
    failed_block = panel[:start(newer)]
    assert 'data-run-status="failed"' in failed_block
    assert 'class="run-error text" role="alert">LLMHTTPError: The endpoint answered 503.<' in failed_block


def test_only_this_sessions_runs_are_listed(logged_in, chat_session, other_team):
    mine = make_run(chat_session, summary="mine")
    sibling = make_run(SessionFactory(kin=chat_session.kin), summary="same kin, other session")
    foreign = make_run(SessionFactory(kin=KinFactory(team=other_team)), summary="other team")

    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())

    assert run_ids(panel) == [mine.pk]
    assert sibling.pk not in run_ids(panel) and foreign.pk not in run_ids(panel)
    assert "same kin, other session" not in panel and "other team" not in panel


def test_the_newest_ten_runs_with_a_link_to_older_ones(logged_in, chat_session):
    runs = [make_run(chat_session, summary=f"run {index}") for index in range(23)]
    newest_first = [run.pk for run in reversed(runs)]

    first = panel_of(logged_in.get(page_url(chat_session)).content.decode())
    more = panel_of(logged_in.get(page_url(chat_session, runs=20)).content.decode())
    partial = logged_in.get(panel_url(chat_session) + "?runs=30", HTTP_HX_REQUEST="true")
    plain = logged_in.get(panel_url(chat_session) + "?runs=20")

    assert run_ids(first) == newest_first[:10]
    assert f'href="{page_url(chat_session, runs=20)}#introspection"' in first
    assert f'hx-get="{panel_url(chat_session)}?runs=20"' in first
    assert run_ids(more) == newest_first[:20] and "?runs=30" in more
    body = partial.content.decode()
    assert partial.status_code == 200 and "<html" not in body
    assert run_ids(body) == newest_first and "Show older runs" not in body
    assert "HX-Request" in partial["Vary"]
    # Without JavaScript the panel's URL is the session page, at the panel.
    assert plain.status_code == 302 and plain["Location"] == page_url(chat_session, runs=20) + "#introspection"
    # A mistyped or huge value falls back to the bounds.
    assert run_ids(panel_of(logged_in.get(page_url(chat_session, runs="x")).content.decode())) == newest_first[:10]


# --- checkpoint now -------------------------------------------------------------------------------


@runs_in_the_request
def test_checkpoint_without_htmx_runs_introspection_and_redirects_back(logged_in, chat_session, scripted):
    say(chat_session, "hi")
    scripted.add("Nothing worth storing.")

    response = logged_in.post(checkpoint_url(chat_session))

    assert response.status_code == 302 and response["Location"] == page_url(chat_session) + "#introspection"
    run = IntrospectionRun.objects.get()
    assert (run.session, run.trigger, run.status, run.summary) == (
        chat_session, "checkpoint", "done", "Nothing worth storing.")
    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())
    assert run_ids(panel) == [run.pk]
    assert "Checkpoint" in panel and "Nothing worth storing." in panel and "1 event read" in panel
    assert 'data-pending="false"' in panel


@runs_in_the_request
def test_checkpoint_with_htmx_swaps_the_panel_with_the_run_and_its_changes(logged_in, chat_session, scripted):
    say(chat_session, "Our churn report deduplicates by customer id from now on.")
    scripted.add(
        {"tool_calls": [
            {"name": "memory_add", "arguments": {"content": "The churn report deduplicates by customer id.",
                                                 "category": "decision", "importance": 7}},
            {"name": "working_memory_update", "arguments": {"content": "Goal: churn report."}},
            {"name": "session_description_update", "arguments": {"description": "Churn report"}},
        ]},
        "Stored the dedup decision.",
    )

    response = logged_in.post(checkpoint_url(chat_session), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" not in body
    run = IntrospectionRun.objects.get()
    memory = Memory.objects.get()
    assert run.status == "done", run.error
    panel = panel_of(body)
    assert f"Checkpoint requested: run #{run.pk}." in panel
    assert run_ids(panel) == [run.pk]
    assert f'href="{reverse("dashboard:memory_detail", args=[chat_session.kin.pk, memory.pk])}"' in panel
    assert "3 tool calls: memory_add, working_memory_update, session_description_update" in panel
    assert 'data-field="working_memory">Goal: churn report.<' in panel
    assert 'data-field="description">Churn report<' in panel
    assert "Stored the dedup decision." in panel
    # The description under the page title is refreshed out of band.
    assert re.search(r'<p id="session-description" class="description text" hx-swap-oob="true">Churn report</p>', body)
    # A finished run: no polling.
    assert "every 2s" not in panel
    # The prompt preview (which shows the working memory) reloads after the swap.
    assert response["HX-Trigger-After-Swap"] == "session-notes-changed"


@runs_in_the_request
def test_failed_run_shows_its_error(logged_in, chat_session, scripted):
    say(chat_session, "hi")
    scripted.add(LLMError("The endpoint answered 503."))

    response = logged_in.post(checkpoint_url(chat_session), HTTP_HX_REQUEST="true")

    panel = panel_of(response.content.decode())
    run = IntrospectionRun.objects.get()
    assert run.status == "failed"
    assert 'data-run-status="failed"' in panel and "The endpoint answered 503." in panel
    assert 'class="run-error text" role="alert"' in panel


def test_a_queued_run_is_shown_and_the_panel_polls_until_it_ends(logged_in, chat_session):
    say(chat_session, "hi")

    # Without the after-commit callbacks run, the run stays queued (a real worker's case).
    response = logged_in.post(checkpoint_url(chat_session), HTTP_HX_REQUEST="true")

    panel = panel_of(response.content.decode())
    run = IntrospectionRun.objects.get()
    assert (run.trigger, run.status) == ("checkpoint", "pending")
    assert 'data-run-status="pending"' in panel and "Queued." in panel
    assert f'hx-get="{panel_url(chat_session)}?runs=10"' in panel
    assert 'hx-trigger="chat-posted from:body, every 2s"' in panel and 'data-polling="true"' in panel
    # A second click reuses the queued run.
    logged_in.post(checkpoint_url(chat_session))
    assert IntrospectionRun.objects.count() == 1


def test_a_run_left_pending_for_long_is_shown_but_not_polled(logged_in, chat_session):
    """A run no worker took (pending for days) is the stalled sweep's to settle: open tabs
    show it, but do not poll every 2 s for ever."""
    old = make_run(chat_session, status=IntrospectionRun.Status.PENDING)
    IntrospectionRun.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))

    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())

    assert 'data-run-status="pending"' in panel
    assert 'hx-trigger="chat-posted from:body"' in panel and 'data-polling="false"' in panel
    # A fresh one beside it is polled again.
    make_run(chat_session, status=IntrospectionRun.Status.PENDING)
    panel = panel_of(logged_in.get(page_url(chat_session)).content.decode())
    assert 'hx-trigger="chat-posted from:body, every 2s"' in panel and 'data-polling="true"' in panel


def test_checkpoint_when_introspection_is_disabled(logged_in, chat_session):
    kin = chat_session.kin
    kin.overrides = {"introspection": {"enabled": False}}
    kin.save()
    say(chat_session, "hi")

    plain = logged_in.post(checkpoint_url(chat_session))
    partial = logged_in.post(checkpoint_url(chat_session), HTTP_HX_REQUEST="true")

    assert plain.status_code == 409
    assert f"Introspection is disabled for kin {kin.name}." in panel_of(plain.content.decode())
    assert partial.status_code == 200
    assert f"Introspection is disabled for kin {kin.name}." in panel_of(partial.content.decode())
    assert not IntrospectionRun.objects.exists()
    page = panel_of(logged_in.get(page_url(chat_session)).content.decode())
    assert re.search(r"<button type=\"submit\" disabled[^>]*>Checkpoint now</button>", page)


def test_checkpoint_needs_post(logged_in, chat_session):
    assert logged_in.get(checkpoint_url(chat_session)).status_code == 405
    assert not IntrospectionRun.objects.exists()


# --- scoping, escaping, queries -------------------------------------------------------------------


def test_other_teams_session_answers_404_and_is_not_introspected(logged_in, other_team):
    foreign = SessionFactory(kin=KinFactory(team=other_team), working_memory="their secret notes")
    say(foreign, "the secret")
    make_run(foreign, summary="their run")

    assert logged_in.get(page_url(foreign)).status_code == 404
    assert logged_in.get(panel_url(foreign), HTTP_HX_REQUEST="true").status_code == 404
    assert logged_in.get(panel_url(foreign)).status_code == 404
    assert logged_in.post(checkpoint_url(foreign)).status_code == 404
    assert logged_in.post(checkpoint_url(foreign), HTTP_HX_REQUEST="true").status_code == 404
    assert IntrospectionRun.objects.filter(session=foreign).count() == 1


def test_panel_urls_need_a_login(client, chat_session):
    for response in (client.get(panel_url(chat_session)), client.post(checkpoint_url(chat_session))):
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert not IntrospectionRun.objects.exists()


def test_script_tags_are_escaped_in_notes_summaries_errors_and_tool_calls(logged_in, chat_session):
    evil = "<script>alert('x')</script>"
    Session.objects.filter(pk=chat_session.pk).update(description=evil, working_memory=evil)
    make_run(chat_session, summary=evil, tool_calls=[{"name": "memory_add", "arguments": {"content": evil},
                                                      "result": evil}])
    make_run(chat_session, status="failed", error=evil)

    body = logged_in.get(page_url(chat_session)).content.decode()
    partial = logged_in.get(panel_url(chat_session), HTTP_HX_REQUEST="true").content.decode()

    for text in (body, partial):
        assert "<script>alert" not in text
    # Title line, description, working memory, summary, arguments, result, error.
    assert body.count("&lt;script&gt;alert(") >= 7


def test_query_count_does_not_grow_with_the_runs(logged_in, chat_session):
    def queries(url, **headers):
        with CaptureQueriesContext(connection) as captured:
            assert logged_in.get(url, **headers).status_code == 200
        return len(captured)

    MessageFactory(session=chat_session, content="hello")
    make_run(chat_session, summary="first")
    few_page, few_panel = queries(page_url(chat_session)), queries(panel_url(chat_session), HTTP_HX_REQUEST="true")

    kin = chat_session.kin
    for index in range(25):
        memory = MemoryFactory(kin=kin, content=f"memory {index}")
        make_run(chat_session, summary=f"run {index}", memories_touched=[{"id": memory.pk, "action": "created"}],
                 tool_calls=[{"name": "memory_add", "arguments": {"content": f"memory {index}"}, "result": "ok"}])

    assert queries(page_url(chat_session)) == few_page
    assert queries(panel_url(chat_session), HTTP_HX_REQUEST="true") == few_panel
    # Session and user, the team (view and context processor), the chat session with its
    # message count, the page's messages, their turns, the runs.
    assert few_page <= 8
    # Session and user, the team (view and context processor), the chat session, the runs.
    assert few_panel <= 6
