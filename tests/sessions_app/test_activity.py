"""The activity pages of a kin and of the team through Django's test client: every kind with
its status and link, newest first across kinds, the kind and status filters and the Failures
shortcut, keyset paging (every row once, equal times included), crafted cursors and unknown
filters (400, not 500), team scoping, escaping and a query count that does not grow with rows."""
import base64
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from consolidation.models import ConsolidationRun
from kinsite.models import LLMCall
from sessions_app import activity
from sessions_app.models import CompactionRun, IntrospectionRun, Turn
from tests.factories import (
    CompactionRunFactory,
    ConsolidationRunFactory,
    IntrospectionRunFactory,
    KinFactory,
    LLMCallFactory,
    MembershipFactory,
    MessageFactory,
    SessionFactory,
    TurnFactory,
    UserFactory,
    WorkflowFactory,
    WorkflowRunFactory,
)
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - timedelta(days=1)


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


def at(row, seconds: float):
    """Set the row's created_at (auto_now_add ignores what a factory passes)."""
    type(row).objects.filter(pk=row.pk).update(created_at=T0 + timedelta(seconds=seconds))
    row.refresh_from_db()
    return row


def kin_url(kin, **params):
    return _with(reverse("dashboard:kin_activity", args=[kin.pk]), params)


def team_url(**params):
    return _with(reverse("dashboard:activity"), params)


def _with(url, params):
    return url + ("?" + urlencode(params, doseq=True) if params else "")


def one_of_each(kin, workflow):
    """A row of every kind, each with a different outcome, 10 s apart (the turn oldest)."""
    chat = SessionFactory(kin=kin, title="Quarterly report")
    rows = {
        "turn": TurnFactory(session=chat, status=Turn.Status.FAILED, error="Upstream timeout\nTraceback..."),
        "introspection": IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.SKIPPED),
        "compaction": CompactionRunFactory(session=chat, status=CompactionRun.Status.DONE),
        "consolidation": ConsolidationRunFactory(kin=kin, status=ConsolidationRun.Status.REJECTED,
                                                 error="The answer did not validate twice."),
        "workflow_run": WorkflowRunFactory(workflow=workflow, status=WorkflowRun.Status.RUNNING),
        "model_call": LLMCallFactory(kin=kin, status=LLMCall.Status.ERROR, error="HTTP 500 from the model",
                                     purpose="turn", model="gpt-test", tokens_in=12, tokens_out=0),
    }
    for index, row in enumerate(rows.values()):
        at(row, 10 * index)
    return rows


def shown(response):
    return [(row.kind, row.pk) for row in response.context["rows"]]


def test_team_page_lists_every_kind_with_its_status_and_link(logged_in, team, kin):
    workflow = WorkflowFactory(team=team, name="Churn report")
    rows = one_of_each(kin, workflow)

    response = logged_in.get(team_url())

    assert response.status_code == 200
    by_kind = {row.kind: row for row in response.context["rows"]}
    assert set(by_kind) == set(rows)
    expected = {
        "turn": ("failed", "failed"),
        "introspection": ("done", "skipped"),
        "compaction": ("done", "done"),
        "consolidation": ("failed", "rejected"),
        "workflow_run": ("running", "running"),
        "model_call": ("failed", "error"),
    }
    assert {kind: (row.status, row.own_status) for kind, row in by_kind.items()} == expected
    turn, chat = rows["turn"], rows["turn"].session
    assert by_kind["turn"].url == (
        f"/sessions/{chat.pk}/?event={turn.user_message_id}#event-{turn.user_message_id}"
    )
    introspection = rows["introspection"]
    assert by_kind["introspection"].url == (
        f"/sessions/{chat.pk}/?run={introspection.pk}#introspection-run-{introspection.pk}"
    )
    assert by_kind["compaction"].url == f"/sessions/{chat.pk}/"
    run = rows["consolidation"]
    assert by_kind["consolidation"].url == f"/kins/{kin.pk}/experience/?run={run.pk}#run-{run.pk}"
    assert by_kind["workflow_run"].url == f"/workflows/{workflow.pk}/"
    assert by_kind["model_call"].url == f"/model-calls/{rows['model_call'].pk}/"
    # Failures show their error's first line only; the kind's own status where it differs.
    assert by_kind["turn"].error == "Upstream timeout"
    assert by_kind["introspection"].error == ""
    body = response.content.decode()
    assert "Upstream timeout" in body and "Traceback" not in body
    assert "failed (rejected)" in body and "done (skipped)" in body
    assert "Churn report" in body and "Quarterly report" in body
    assert f'href="/sessions/{chat.pk}/?event={turn.user_message_id}#event-{turn.user_message_id}"' in body
    assert f'href="/kins/{kin.pk}/experience/?run={run.pk}#run-{run.pk}"' in body


def test_rows_come_newest_first_across_kinds(logged_in, team, kin):
    rows = one_of_each(kin, WorkflowFactory(team=team))
    at(rows["compaction"], 100)  # now the newest
    at(rows["model_call"], -5)  # now the oldest

    response = logged_in.get(team_url())

    assert [kind for kind, _ in shown(response)] == [
        "compaction", "workflow_run", "consolidation", "introspection", "turn", "model_call",
    ]


def test_kin_page_lists_only_the_kins_work(logged_in, team, kin):
    rows = one_of_each(kin, WorkflowFactory(team=team))
    other_kin = KinFactory(team=team)
    TurnFactory(session=SessionFactory(kin=other_kin), status=Turn.Status.FAILED)
    LLMCallFactory(kin=other_kin)
    LLMCallFactory(team=team, kin=None)  # a team-level call (e.g. a workflow's)

    response = logged_in.get(kin_url(kin))

    assert response.status_code == 200
    assert sorted(shown(response)) == sorted(
        (kind, row.pk) for kind, row in rows.items() if kind != "workflow_run"
    )
    # A kin's page offers no workflow runs, and says so when asked.
    response = logged_in.get(kin_url(kin, kind="workflow_run"))
    assert response.status_code == 400
    assert "Unknown kind &#x27;workflow_run&#x27;" in response.content.decode()


def test_filter_by_kind_and_status(logged_in, team, kin):
    rows = one_of_each(kin, WorkflowFactory(team=team))
    done_turn = at(TurnFactory(session=rows["turn"].session, status=Turn.Status.DONE), 200)

    response = logged_in.get(team_url(kind=["turn", "model_call"]))
    assert sorted(shown(response)) == sorted(
        [("turn", rows["turn"].pk), ("turn", done_turn.pk), ("model_call", rows["model_call"].pk)]
    )

    response = logged_in.get(team_url(kind="turn", status="done"))
    assert shown(response) == [("turn", done_turn.pk)]
    response = logged_in.get(team_url(kind=["turn", "turn"], status=["done", "done"]))
    assert shown(response) == [("turn", done_turn.pk)]

    # Done includes a kind's own words for it: a skipped introspection, an applied consolidation.
    response = logged_in.get(team_url(status="done"))
    assert {kind for kind, _ in shown(response)} == {"turn", "introspection", "compaction"}


def test_failures_shortcut_lists_every_failed_row_and_nothing_else(logged_in, team, kin):
    rows = one_of_each(kin, WorkflowFactory(team=team))
    failed_run = at(WorkflowRunFactory(workflow=rows["workflow_run"].workflow, status=WorkflowRun.Status.FAILED,
                                       error="Node 'load' failed: no such table"), 300)

    page = logged_in.get(team_url(kind="turn"))
    assert page.context["failures_url"] == "?kind=turn&status=failed"
    everything = logged_in.get(team_url())
    response = logged_in.get(reverse("dashboard:activity") + everything.context["failures_url"])

    assert shown(response) == [
        ("workflow_run", failed_run.pk), ("model_call", rows["model_call"].pk),
        ("consolidation", rows["consolidation"].pk), ("turn", rows["turn"].pk),
    ]
    assert "Node &#x27;load&#x27; failed: no such table" in response.content.decode()


def test_paging_visits_every_row_once_with_equal_times(logged_in, team, kin, monkeypatch):
    monkeypatch.setattr(activity, "PAGE_SIZE", 4)
    chat = SessionFactory(kin=kin)
    rows = [TurnFactory(session=chat) for _ in range(5)]
    rows += [IntrospectionRunFactory(session=chat) for _ in range(3)]
    rows += [LLMCallFactory(kin=kin) for _ in range(4)]
    rows += [WorkflowRunFactory(workflow=WorkflowFactory(team=team)) for _ in range(2)]
    for row in rows:  # all at the same instant, but two older turns
        at(row, 0)
    at(rows[0], -1)
    at(rows[1], -1)

    seen, url, pages = [], team_url(), 0
    while url:
        response = logged_in.get(url)
        assert response.status_code == 200
        assert len(response.context["rows"]) <= 4
        seen += [(row.created_at, row.kind, row.pk) for row in response.context["rows"]]
        next_url = response.context["next_url"]
        url = reverse("dashboard:activity") + next_url if next_url else None
        pages += 1

    assert pages == 4
    assert len(seen) == len(set(seen)) == 14
    assert seen == sorted(seen, reverse=True)
    assert {(kind, pk) for _, kind, pk in seen} == {
        (activity_kind(row), row.pk) for row in rows
    }
    assert seen[-2:] == [(rows[1].created_at, "turn", rows[1].pk), (rows[0].created_at, "turn", rows[0].pk)]


def activity_kind(row) -> str:
    return {Turn: "turn", IntrospectionRun: "introspection", LLMCall: "model_call", WorkflowRun: "workflow_run"}[
        type(row)
    ]


def test_paging_keeps_the_filters(logged_in, team, kin, monkeypatch):
    monkeypatch.setattr(activity, "PAGE_SIZE", 2)
    chat = SessionFactory(kin=kin)
    failed = [at(TurnFactory(session=chat, status=Turn.Status.FAILED), i) for i in range(3)]
    at(TurnFactory(session=chat, status=Turn.Status.DONE), 10)

    first = logged_in.get(kin_url(kin, status="failed"))
    assert shown(first) == [("turn", failed[2].pk), ("turn", failed[1].pk)]
    assert "status=failed" in first.context["next_url"]
    second = logged_in.get(kin_url(kin) + first.context["next_url"])
    assert shown(second) == [("turn", failed[0].pk)]
    assert second.context["next_url"] is None


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "not-a-cursor!",
    "%%%",
    _b64("garbage"),
    _b64("2026-01-01T00:00:00|turn"),
    _b64("2026-01-01T00:00:00|turn|5"),  # no time zone
    _b64("2026-01-01T00:00:00+00:00|nonsense|5"),
    _b64("2026-01-01T00:00:00+00:00|turn|-5"),
    _b64("2026-01-01T00:00:00+00:00|turn|0"),
    _b64("2026-01-01T00:00:00+00:00|turn|99999999999999999999999"),
    _b64("9999-99-99T00:00:00+00:00|turn|5"),
    _b64("0001-01-01T00:00:00+05:00|turn|5"),
    _b64("9999-12-31T23:59:59-05:00|turn|5"),
    _b64("2026-01-01T00:00:00+00:00|turn|5|6"),
    base64.urlsafe_b64encode(b"\xff\xfe\x00").decode(),
    "A" * 500,
])
def test_crafted_cursor_answers_400_with_a_clear_message(logged_in, kin, cursor):
    TurnFactory(session=SessionFactory(kin=kin))
    for url in (team_url(cursor=cursor), kin_url(kin, cursor=cursor)):
        response = logged_in.get(url)
        assert response.status_code == 400
        assert "This page link is broken or out of date" in response.content.decode()
        assert response.context["rows"] == []


def test_cursor_round_trips():
    key = (T0 + timedelta(microseconds=123456), "model_call", 42)
    assert activity.cursor_decode(activity.cursor_encode(key)) == key


@pytest.mark.parametrize("params, message", [
    ({"kind": "turns"}, "Unknown kind &#x27;turns&#x27;"),
    ({"status": "error"}, "Unknown status &#x27;error&#x27;: choose among pending, running, done, failed."),
    ({"status": "<b>x</b>"}, "Unknown status &#x27;&lt;b&gt;x&lt;/b&gt;&#x27;"),
])
def test_unknown_filter_values_answer_400_with_the_choices(logged_in, params, message):
    response = logged_in.get(team_url(**params))
    assert response.status_code == 400
    assert message in response.content.decode()


def test_empty_filters_mean_no_filter(logged_in, kin):
    turn = TurnFactory(session=SessionFactory(kin=kin))
    response = logged_in.get(team_url(status="", kind=""))
    assert response.status_code == 200
    assert shown(response) == [("turn", turn.pk)]


def test_empty_state_says_what_to_do_next(logged_in, kin):
    body = logged_in.get(kin_url(kin)).content.decode()
    assert "No activity yet" in body and "send a message" in body
    body = logged_in.get(team_url(status="failed")).content.decode()
    assert "Nothing matches these filters" in body


def test_another_teams_kin_and_rows_stay_hidden(logged_in, team, kin, other_team):
    mine = TurnFactory(session=SessionFactory(kin=kin), status=Turn.Status.FAILED)
    stranger = KinFactory(team=other_team, name="Mallory")
    one_of_each(stranger, WorkflowFactory(team=other_team, name="Their workflow"))
    theirs = LLMCallFactory(team=other_team, kin=None)

    assert logged_in.get(kin_url(stranger)).status_code == 404
    assert logged_in.get(reverse("dashboard:model_call_detail", args=[theirs.pk])).status_code == 404
    for params in ({}, {"status": "failed"}, {"kind": "workflow_run"}):
        response = logged_in.get(team_url(**params))
        assert all(row.kin_name != "Mallory" for row in response.context["rows"])
        assert "Mallory" not in response.content.decode() and "Their workflow" not in response.content.decode()
    assert shown(logged_in.get(team_url())) == [("turn", mine.pk)]


def test_plain_team_members_see_the_pages(client, team, kin):
    member = UserFactory()
    MembershipFactory(team=team, user=member, role="member")
    client.force_login(member)
    call = LLMCallFactory(kin=kin, status=LLMCall.Status.ERROR, error="boom")
    assert not member.is_staff
    assert client.get(team_url()).status_code == 200
    assert client.get(kin_url(kin)).status_code == 200
    response = client.get(reverse("dashboard:model_call_detail", args=[call.pk]))
    assert response.status_code == 200 and "boom" in response.content.decode()


def test_stored_text_is_escaped(logged_in, team, kin):
    chat = SessionFactory(kin=kin, title="<script>alert(1)</script>")
    TurnFactory(session=chat, status=Turn.Status.FAILED, error="<img src=x onerror=alert(2)>")
    WorkflowRunFactory(workflow=WorkflowFactory(team=team, name="<b>wf</b>"))
    LLMCallFactory(kin=kin, purpose="<i>p</i>", status=LLMCall.Status.ERROR, error="<svg onload=x>")

    body = logged_in.get(team_url()).content.decode()

    for raw in ("<script>alert(1)", "<img src=x", "<b>wf</b>", "<i>p</i>", "<svg onload"):
        assert raw not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "&lt;img src=x onerror=alert(2)&gt;" in body


def test_query_count_does_not_grow_with_rows(logged_in, team, kin, django_assert_max_num_queries):
    def add_rows(count):
        workflow = WorkflowFactory(team=team)
        for _ in range(count):
            one_of_each(KinFactory(team=team), workflow)
            one_of_each(kin, workflow)

    def queries(url):
        with CaptureQueriesContext(connection) as captured:
            assert logged_in.get(url).status_code == 200
        return len(captured)

    add_rows(2)
    few = (queries(team_url()), queries(kin_url(kin)))
    add_rows(12)
    # One query per kind (6), the session, user and team, and the kin on its page.
    with django_assert_max_num_queries(10):
        response = logged_in.get(team_url())
    assert len(response.context["rows"]) == activity.PAGE_SIZE
    with django_assert_max_num_queries(10):
        logged_in.get(kin_url(kin))
    assert (queries(team_url()), queries(kin_url(kin))) == few


def test_turn_link_opens_the_conversation_page_holding_the_message(logged_in, kin):
    chat = SessionFactory(kin=kin)
    first = MessageFactory(session=chat)
    TurnFactory(session=chat, user_message=first, status=Turn.Status.FAILED, error="Model down")
    for _ in range(60):  # newer messages push the first one to page 2
        MessageFactory(session=chat)
    [row] = logged_in.get(kin_url(kin, kind="turn")).context["rows"]

    response = logged_in.get(row.url.split("#")[0])

    assert response.context["page"].number == 2
    body = response.content.decode()
    assert f'id="event-{first.pk}"' in body and "Model down" in body


def test_model_call_detail_shows_the_call(logged_in, kin):
    call = LLMCallFactory(kin=kin, purpose="introspection", model="gpt-test", tokens_in=1200, tokens_out=34,
                          status=LLMCall.Status.ERROR, error="RateLimited: try later\nsecond line")
    response = logged_in.get(reverse("dashboard:model_call_detail", args=[call.pk]))
    body = response.content.decode()
    assert response.status_code == 200
    assert "introspection" in body and "gpt-test" in body and "1200 in / 34 out" in body
    assert "RateLimited: try later\nsecond line" in body
    assert f'href="/kins/{kin.pk}/activity/"' in body


def test_pages_are_linked_from_the_kin_page_and_the_navigation(logged_in, kin):
    body = logged_in.get(reverse("dashboard:kin_detail", args=[kin.pk])).content.decode()
    assert f'href="/kins/{kin.pk}/activity/"' in body
    assert 'href="/activity/"' in body


@pytest.mark.postgres
def test_newest_first_reads_use_the_indexes(team, kin):
    """With sequential scans, bitmap scans and sorts priced out, each source's first-page read
    is an index scan on an index this feature added (the tables are too small for the planner
    otherwise)."""
    scope_kin, scope_team = activity.Scope(team=team, kin=kin), activity.Scope(team=team)
    expected = {
        ("turn", False): "turn_newest",
        ("introspection", False): "introspection_run_newest",
        ("compaction", False): "compaction_run_newest",
        ("consolidation", True): "consolidation_run_kin_newest",
        ("model_call", True): "llmcall_kin_newest",
        ("model_call", False): "llmcall_team_newest",
    }
    # Not asserted: the team's workflow runs, read through workflow_run_newest or sorted after a
    # join, as the planner sees fit (workflow runs are started by hand, a few a day).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        for (kind, on_kin), index in expected.items():
            rows = activity.SOURCES[kind].rows(scope_kin if on_kin else scope_team)
            sql, params = rows.order_by("-created_at", "-id")[:51].query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
            assert index in plan, (kind, plan)


@pytest.mark.parametrize("event", ["abc", "-1", "0", "9" * 40, "other-session"])
def test_session_page_ignores_an_event_it_does_not_hold(logged_in, kin, event):
    chat = SessionFactory(kin=kin)
    for _ in range(55):
        MessageFactory(session=chat)
    if event == "other-session":
        event = str(MessageFactory(session=SessionFactory(kin=kin)).pk)
    response = logged_in.get(reverse("dashboard:session_detail", args=[chat.pk]), {"event": event})
    assert response.status_code == 200
    assert response.context["page"].number == 1


def test_introspection_link_opens_the_panel_down_to_the_run(logged_in, kin):
    chat = SessionFactory(kin=kin)
    old = at(IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.FAILED, error="Too old to list"), 0)
    for second in range(1, 15):  # more newer runs than the panel lists by default
        at(IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.DONE), second)
    [row] = logged_in.get(kin_url(kin, status="failed")).context["rows"]

    response = logged_in.get(row.url.split("#")[0])

    assert response.context["runs_shown"] == 15
    body = response.content.decode()
    assert f'id="introspection-run-{old.pk}"' in body and "Too old to list" in body
    assert logged_in.get(reverse("dashboard:session_detail", args=[chat.pk])).context["runs_shown"] == 10
