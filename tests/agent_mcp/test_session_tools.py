"""The MCP tools that find and read a kin's sessions (session_list, session_read) over HTTP:
the same rows and fields as the API's GET /kins/{id}/sessions/ and GET /sessions/{id}/,
paging on with before_id, and another team's ids answering "not found"."""
from sessions_app.models import Session
from tests.agent_mcp.conftest import call, error_text, with_client
from tests.factories import KinFactory, SessionFactory, SummaryFactory, TeamFactory


def test_session_list_pages_newest_first_as_the_api_lists_them(mcp_url, mcp_token, mcp_kin, mcp_api_client):
    sessions = SessionFactory.create_batch(3, kin=mcp_kin)
    SessionFactory(kin=KinFactory(team=mcp_kin.team))  # another kin of the team

    first = call(mcp_url, mcp_token, "session_list", {"kin_id": mcp_kin.pk, "limit": 2}).structured_content
    rest = call(mcp_url, mcp_token, "session_list",
                {"kin_id": mcp_kin.pk, "limit": 2, "before_id": first["sessions"][-1]["id"]}).structured_content

    assert [s["id"] for s in first["sessions"]] == [sessions[2].pk, sessions[1].pk] and first["more"] is True
    assert [s["id"] for s in rest["sessions"]] == [sessions[0].pk] and rest["more"] is False
    api = mcp_api_client.get(f"/api/v1/kins/{mcp_kin.pk}/sessions/").json()["results"]
    assert first["sessions"] + rest["sessions"] == api


def test_session_list_filters_by_archived(mcp_url, mcp_token, mcp_kin):
    open_session = SessionFactory(kin=mcp_kin)
    old = SessionFactory(kin=mcp_kin)
    Session.objects.filter(pk=old.pk).update(archived_at=old.created_at)

    def work(client):
        async def both():
            return [await client.call_tool("session_list", {"kin_id": mcp_kin.pk, "archived": flag})
                    for flag in (True, False)]
        return both()

    only_archived, only_open = with_client(mcp_url, mcp_token, work)

    assert [s["id"] for s in only_archived.structured_content["sessions"]] == [old.pk]
    assert only_archived.structured_content["sessions"][0]["archived"] is True
    assert [s["id"] for s in only_open.structured_content["sessions"]] == [open_session.pk]


def test_session_read_answers_what_the_api_shows(mcp_url, mcp_token, mcp_session, mcp_api_client):
    Session.objects.filter(pk=mcp_session.pk).update(description="Planning the launch.",
                                                     working_memory="- launch on Monday")
    SummaryFactory(session=mcp_session, content="They agreed on Monday.")

    body = call(mcp_url, mcp_token, "session_read", {"session_id": mcp_session.pk}).structured_content["session"]

    assert body == mcp_api_client.get(f"/api/v1/sessions/{mcp_session.pk}/").json()
    assert body["summary"] == "They agreed on Monday." and body["working_memory"] == "- launch on Monday"


def test_another_teams_kin_and_session_answer_not_found(mcp_url, mcp_token):
    theirs = SessionFactory(kin=KinFactory(team=TeamFactory()))

    listed = call(mcp_url, mcp_token, "session_list", {"kin_id": theirs.kin_id})
    read = call(mcp_url, mcp_token, "session_read", {"session_id": theirs.pk})
    missing = call(mcp_url, mcp_token, "session_read", {"session_id": theirs.pk + 1000})

    assert error_text(listed) == f"Error executing tool session_list: Kin {theirs.kin_id} not found."
    assert error_text(read) == f"Error executing tool session_read: Session {theirs.pk} not found."
    assert error_text(missing) == f"Error executing tool session_read: Session {theirs.pk + 1000} not found."


def test_session_list_with_a_limit_out_of_range_answers_a_tool_error(mcp_url, mcp_token, mcp_kin):
    result = call(mcp_url, mcp_token, "session_list", {"kin_id": mcp_kin.pk, "limit": 101})

    assert "limit" in error_text(result)
