"""A kin's sessions through the API: the list (newest first, cursor-paged, ?archived=), one
session (title, description, working memory, summary, workflow, archived) and PATCH, which
renames and archives through the dashboard's services and refuses anything else."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.models import Session
from tests.factories import KinFactory, MessageFactory, SessionFactory, SummaryFactory, WorkflowFactory
from tests.sessions_app.test_api_access import assert_api_error

pytestmark = pytest.mark.usefixtures("empty_cache")


def sessions_url(kin) -> str:
    return f"/api/v1/kins/{kin.pk}/sessions/"


def session_url(session) -> str:
    return f"/api/v1/sessions/{session.pk}/"


def listed_ids(response) -> list[int]:
    assert response.status_code == 200, response.content[:500]
    return [session["id"] for session in response.json()["results"]]


def archived(kin, **fields) -> Session:
    session = SessionFactory(kin=kin, **fields)
    Session.objects.filter(pk=session.pk).update(archived_at=session.created_at)
    return session


# --- the list ------------------------------------------------------------------------------------


def test_list_answers_the_kins_sessions_newest_first_archived_included(api_client, kin):
    first = SessionFactory(kin=kin)
    old = archived(kin)
    newest = SessionFactory(kin=kin)
    SessionFactory(kin=KinFactory(team=kin.team))  # another kin of the same team

    assert listed_ids(api_client.get(sessions_url(kin))) == [newest.pk, old.pk, first.pk]


@pytest.mark.parametrize(("value", "wanted"), [("true", ["old"]), ("false", ["open"]), ("1", ["old"])])
def test_list_filters_by_archived(api_client, kin, value, wanted):
    sessions = {"open": SessionFactory(kin=kin), "old": archived(kin)}

    response = api_client.get(sessions_url(kin), {"archived": value})

    assert listed_ids(response) == [sessions[name].pk for name in wanted]
    assert [session["archived"] for session in response.json()["results"]] == [name == "old" for name in wanted]


@pytest.mark.parametrize("value", ["maybe", "", "archived"])
def test_list_with_a_bad_archived_value_answers_400(api_client, kin, value):
    SessionFactory(kin=kin)

    error = assert_api_error(api_client.get(sessions_url(kin), {"archived": value}), 400)

    assert "archived" in error["details"]


def test_list_pages_with_a_cursor_without_repeating_or_skipping(api_client, kin):
    sessions = SessionFactory.create_batch(5, kin=kin)

    first = api_client.get(sessions_url(kin), {"limit": 2})
    pages, url = [listed_ids(first)], first.json()["next"]
    while url:
        response = api_client.get(url)
        pages.append(listed_ids(response))
        url = response.json()["next"]

    assert pages == [[sessions[4].pk, sessions[3].pk], [sessions[2].pk, sessions[1].pk], [sessions[0].pk]]


def test_list_shows_what_each_session_holds(api_client, kin):
    workflow = WorkflowFactory(team=kin.team)
    session = SessionFactory(kin=kin, title="Launch", description="Planning the launch.",
                             working_memory="- launch on Monday", workflow=workflow)
    MessageFactory.create_batch(2, session=session)
    SummaryFactory(session=session, content="Older summary.")
    SummaryFactory(session=session, content="They agreed on Monday.")

    (body,) = api_client.get(sessions_url(kin)).json()["results"]

    assert body["title"] == "Launch" and body["description"] == "Planning the launch."
    assert body["working_memory"] == "- launch on Monday"
    assert body["summary"] == "They agreed on Monday."
    assert body["message_count"] == 4  # two, and one covered by each summary
    assert body["workflow"] == workflow.pk
    assert body["archived"] is False and body["archived_at"] is None


def _list_statements(api_client, kin) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = api_client.get(sessions_url(kin))
    assert response.status_code == 200
    return len([query for query in captured.captured_queries if "SAVEPOINT" not in query["sql"]])


def test_a_page_of_sessions_costs_the_same_statements_as_one(api_client, kin):
    session = SessionFactory(kin=kin)
    MessageFactory(session=session)
    SummaryFactory(session=session)
    api_client.get(sessions_url(kin))  # the token's first use records last_used_at
    one = _list_statements(api_client, kin)

    for session in SessionFactory.create_batch(12, kin=kin):
        MessageFactory.create_batch(2, session=session)
        SummaryFactory(session=session)
    many = _list_statements(api_client, kin)

    assert many == one == 2  # the kin, and the page with its counts and summaries (the token is cached)


# --- one session ---------------------------------------------------------------------------------


def test_get_shows_the_summary_and_whether_archived(api_client, kin):
    session = archived(kin, working_memory="- notes")
    SummaryFactory(session=session, content="What happened so far.")

    body = api_client.get(session_url(session)).json()

    assert body["summary"] == "What happened so far."
    assert body["working_memory"] == "- notes"
    assert body["archived"] is True and body["archived_at"] is not None


def test_get_without_a_summary_answers_null(api_client, chat_session):
    assert api_client.get(session_url(chat_session)).json()["summary"] is None


def test_created_session_answers_the_same_shape_as_get(api_client, kin):
    created = api_client.post(sessions_url(kin), {"title": "Fresh"}, format="json").json()

    assert created == api_client.get(f"/api/v1/sessions/{created['id']}/").json()
    assert created["summary"] is None and created["archived"] is False


# --- PATCH ---------------------------------------------------------------------------------------


def test_patch_renames_title_and_description(api_client, chat_session):
    response = api_client.patch(session_url(chat_session), {"title": "  Q3 launch ", "description": "The launch."},
                                format="json")

    assert response.status_code == 200, response.content
    assert response.json()["title"] == "Q3 launch" and response.json()["description"] == "The launch."
    chat_session.refresh_from_db()
    assert (chat_session.title, chat_session.description) == ("Q3 launch", "The launch.")


def test_patch_archives_and_unarchives(api_client, chat_session):
    response = api_client.patch(session_url(chat_session), {"archived": True}, format="json")

    assert response.status_code == 200 and response.json()["archived"] is True
    chat_session.refresh_from_db()
    assert chat_session.archived_at is not None
    posted = api_client.post(f"{session_url(chat_session)}messages/", {"content": "hello"}, format="json")
    assert_api_error(posted, 409, code="session_archived")

    response = api_client.patch(session_url(chat_session), {"archived": False}, format="json")

    assert response.status_code == 200 and response.json()["archived"] is False
    chat_session.refresh_from_db()
    assert chat_session.archived_at is None


def test_patch_archiving_an_archived_session_keeps_its_date(api_client, kin):
    session = archived(kin)
    before = Session.objects.get(pk=session.pk).archived_at

    response = api_client.patch(session_url(session), {"archived": True, "title": "Done"}, format="json")

    assert response.status_code == 200
    session.refresh_from_db()
    assert session.archived_at == before and session.title == "Done"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": "Renamed", "working_memory": "injected"}, "working_memory"),
        ({"title": "Renamed", "kin": 1}, "kin"),
        ({"title": "Renamed", "workflow": None}, "workflow"),
        ({"archived_at": None}, "archived_at"),
        ({"title": "Renamed", "colour": "red"}, "colour"),
        ({"title": "x" * 201}, "title"),
        ({"title": "two\nlines"}, "title"),
        ({"description": "y" * 301}, "description"),
        ({"title": None}, "title"),
        ({"archived": "perhaps"}, "archived"),
    ],
)
def test_patch_refuses_what_it_cannot_change_and_changes_nothing(api_client, chat_session, body, field):
    before = Session.objects.filter(pk=chat_session.pk).values().get()

    error = assert_api_error(api_client.patch(session_url(chat_session), body, format="json"), 400)

    assert field in error["details"]
    assert Session.objects.filter(pk=chat_session.pk).values().get() == before


@pytest.mark.parametrize("body", [{}, []])
def test_patch_with_nothing_to_change_answers_400(api_client, chat_session, body):
    before = Session.objects.filter(pk=chat_session.pk).values().get()

    assert_api_error(api_client.patch(session_url(chat_session), body, format="json"), 400)

    assert Session.objects.filter(pk=chat_session.pk).values().get() == before


def test_put_is_not_allowed(api_client, chat_session):
    assert_api_error(api_client.put(session_url(chat_session), {"title": "x"}, format="json"), 405)


# --- another team's ids --------------------------------------------------------------------------


def test_another_teams_kin_and_session_answer_404_and_change_nothing(api_client, other_team):
    foreign = SessionFactory(kin=KinFactory(team=other_team), title="Theirs")

    assert_api_error(api_client.get(sessions_url(foreign.kin)), 404, code="not_found")
    assert_api_error(api_client.get(sessions_url(foreign.kin), {"archived": "maybe"}), 404, code="not_found")
    assert_api_error(api_client.get(session_url(foreign)), 404, code="not_found")
    assert_api_error(api_client.patch(session_url(foreign), {"archived": True}, format="json"), 404,
                     code="not_found")
    foreign.refresh_from_db()
    assert foreign.archived_at is None and foreign.title == "Theirs"
