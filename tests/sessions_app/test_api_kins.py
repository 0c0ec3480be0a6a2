"""The kins API (create, list, patch, delete, validation) and session create/get."""
import pytest

from kinsite.models import Kin
from sessions_app.models import Session
from tests.factories import KinFactory, MessageFactory, SessionFactory
from tests.sessions_app.test_api_access import assert_api_error

KINS = "/api/v1/kins/"


def _all_pages(client, url):
    """Follows `next` links; returns the pages' results in order."""
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"next", "previous", "results"}
        pages.append(body["results"])
        url = body["next"]
    return pages


# --- create -------------------------------------------------------------------------


def test_create_kin_stores_it_for_the_callers_team(api_client, team):
    response = api_client.post(
        KINS,
        {"name": "  Ada  ", "role": "Analyst", "expertise": "SQL", "overrides": {"introspection": {"enabled": False}}},
        format="json",
    )

    assert response.status_code == 201
    body = response.json()
    kin = Kin.objects.get(pk=body["id"])
    assert kin.team == team
    assert kin.name == body["name"] == "Ada"
    assert body["role"] == "Analyst" and body["expertise"] == "SQL"
    assert body["overrides"] == {"introspection": {"enabled": False}}
    assert body["parent"] is None and body["history_token_budget"] is None


def test_create_kin_ignores_read_only_and_unknown_fields(api_client, team, other_team):
    response = api_client.post(KINS, {"name": "Ada", "id": 999_999, "team": other_team.pk}, format="json")

    assert response.status_code == 201
    kin = Kin.objects.get(pk=response.json()["id"])
    assert kin.pk != 999_999
    assert kin.team == team


def test_create_sub_kin_with_parent_of_own_team(api_client, kin):
    response = api_client.post(KINS, {"name": "Child", "parent": kin.pk, "spawn_reason": "research"}, format="json")

    assert response.status_code == 201
    assert Kin.objects.get(pk=response.json()["id"]).parent == kin


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({}, "name"),
        ({"name": None}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "Ada", "overrides": ["not", "an", "object"]}, "overrides"),
        ({"name": "Ada", "history_token_budget": 10}, "history_token_budget"),
        ({"name": "Ada", "history_token_budget": "lots"}, "history_token_budget"),
        ({"name": "Ada", "parent": "abc"}, "parent"),
    ],
)
def test_create_kin_with_invalid_input_answers_400(api_client, team, payload, field):
    response = api_client.post(KINS, payload, format="json")

    error = assert_api_error(response, 400)
    assert field in error["details"]
    assert not Kin.objects.exists()


def test_create_kin_with_parent_of_another_team_answers_400_like_an_unknown_id(api_client, other_team):
    foreign = KinFactory(team=other_team, name="Foreign parent")
    unknown_id = foreign.pk + 1000

    foreign_response = api_client.post(KINS, {"name": "Ada", "parent": foreign.pk}, format="json")
    unknown_response = api_client.post(KINS, {"name": "Ada", "parent": unknown_id}, format="json")

    foreign_error = assert_api_error(foreign_response, 400)
    unknown_error = assert_api_error(unknown_response, 400)
    assert "parent" in foreign_error["details"]
    # Nothing tells "exists in another team" apart from "does not exist".
    assert foreign_error["details"]["parent"] == [
        message.replace(str(unknown_id), str(foreign.pk)) for message in unknown_error["details"]["parent"]
    ]
    assert "Foreign parent" not in foreign_response.content.decode()
    assert list(Kin.objects.values_list("pk", flat=True)) == [foreign.pk]


def test_create_kin_with_malformed_json_answers_400(api_client):
    response = api_client.post(KINS, data='{"name": "Ada",', content_type="application/json")

    assert_api_error(response, 400)
    assert not Kin.objects.exists()


# --- list and get -------------------------------------------------------------------


def test_list_kins_paginates_with_cursor_without_duplicates(api_client, team):
    kins = KinFactory.create_batch(7, team=team)

    pages = _all_pages(api_client, f"{KINS}?limit=3")

    assert [len(page) for page in pages] == [3, 3, 1]
    ids = [kin["id"] for page in pages for kin in page]
    assert ids == [kin.pk for kin in kins]


def test_cursor_pages_stay_consistent_when_kins_are_added_between_pages(api_client, team):
    first_batch = KinFactory.create_batch(4, team=team)
    first = api_client.get(f"{KINS}?limit=2").json()
    added = KinFactory(team=team)

    rest = _all_pages(api_client, first["next"])

    ids = [kin["id"] for kin in first["results"]] + [kin["id"] for page in rest for kin in page]
    assert ids == [kin.pk for kin in first_batch] + [added.pk]


def test_previous_link_returns_the_earlier_page(api_client, team):
    KinFactory.create_batch(4, team=team)
    first = api_client.get(f"{KINS}?limit=2").json()
    second = api_client.get(first["next"]).json()

    back = api_client.get(second["previous"]).json()

    assert back["results"] == first["results"]


def test_list_kins_with_garbage_cursor_answers_error_shape(api_client, kin):
    response = api_client.get(f"{KINS}?cursor=not-a-cursor")

    error = assert_api_error(response, 400)
    assert "cursor" in error["details"]


def test_get_kin(api_client, kin):
    response = api_client.get(f"{KINS}{kin.pk}/")

    assert response.status_code == 200
    assert response.json()["id"] == kin.pk
    assert response.json()["name"] == kin.name


def test_get_kin_with_non_numeric_id_answers_404(api_client, kin):
    assert_api_error(api_client.get(f"{KINS}abc/"), 404)


# --- patch ----------------------------------------------------------------------------


def test_patch_kin_changes_only_given_fields(api_client, kin):
    response = api_client.patch(f"{KINS}{kin.pk}/", {"role": "Reviewer", "history_token_budget": 8000}, format="json")

    assert response.status_code == 200
    kin.refresh_from_db()
    assert kin.role == "Reviewer"
    assert kin.history_token_budget == 8000
    assert response.json()["name"] == kin.name


def test_patch_kin_sets_and_clears_parent(api_client, team, kin):
    parent = KinFactory(team=team)

    set_response = api_client.patch(f"{KINS}{kin.pk}/", {"parent": parent.pk}, format="json")
    kin.refresh_from_db()
    assert set_response.status_code == 200 and kin.parent == parent

    clear_response = api_client.patch(f"{KINS}{kin.pk}/", {"parent": None}, format="json")
    kin.refresh_from_db()
    assert clear_response.status_code == 200 and kin.parent is None


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"name": ""}, "name"),
        ({"name": "  "}, "name"),
        ({"overrides": "text"}, "overrides"),
        ({"history_token_budget": -1}, "history_token_budget"),
    ],
)
def test_patch_kin_with_invalid_input_answers_400(api_client, kin, payload, field):
    name_before = kin.name

    error = assert_api_error(api_client.patch(f"{KINS}{kin.pk}/", payload, format="json"), 400)

    assert field in error["details"]
    kin.refresh_from_db()
    assert kin.name == name_before


def test_patch_kin_as_its_own_parent_answers_400(api_client, kin):
    error = assert_api_error(api_client.patch(f"{KINS}{kin.pk}/", {"parent": kin.pk}, format="json"), 400)

    assert "parent" in error["details"]
    kin.refresh_from_db()
    assert kin.parent is None


def test_patch_kin_that_would_close_a_parent_loop_answers_400(api_client, kin):
    child = KinFactory(team=kin.team, parent=kin)
    grandchild = KinFactory(team=kin.team, parent=child)

    error = assert_api_error(api_client.patch(f"{KINS}{kin.pk}/", {"parent": grandchild.pk}, format="json"), 400)

    assert "parent" in error["details"]
    kin.refresh_from_db()
    assert kin.parent is None


def test_patch_kin_with_parent_of_another_team_answers_400(api_client, kin, other_team):
    foreign = KinFactory(team=other_team)

    error = assert_api_error(api_client.patch(f"{KINS}{kin.pk}/", {"parent": foreign.pk}, format="json"), 400)

    assert "parent" in error["details"]
    kin.refresh_from_db()
    assert kin.parent is None


def test_put_is_not_allowed(api_client, kin):
    assert_api_error(api_client.put(f"{KINS}{kin.pk}/", {"name": "Full"}, format="json"), 405)


# --- delete ---------------------------------------------------------------------------


def test_delete_kin_removes_it_and_its_sessions(api_client, kin, chat_session):
    MessageFactory(session=chat_session)

    response = api_client.delete(f"{KINS}{kin.pk}/")

    assert response.status_code == 204
    assert not Kin.objects.filter(pk=kin.pk).exists()
    assert not Session.objects.filter(pk=chat_session.pk).exists()
    assert_api_error(api_client.get(f"{KINS}{kin.pk}/"), 404)


def test_delete_parent_kin_keeps_children(api_client, team, kin):
    child = KinFactory(team=team, parent=kin)

    assert api_client.delete(f"{KINS}{kin.pk}/").status_code == 204

    child.refresh_from_db()
    assert child.parent is None


# --- sessions -------------------------------------------------------------------------


def test_create_session_for_kin(api_client, kin):
    response = api_client.post(f"{KINS}{kin.pk}/sessions/", {"title": "Planning"}, format="json")

    assert response.status_code == 201
    body = response.json()
    session = Session.objects.get(pk=body["id"])
    assert session.kin == kin and session.title == "Planning"
    assert body["kin"] == kin.pk
    assert body["message_count"] == 0


def test_create_session_without_body(api_client, kin):
    response = api_client.post(f"{KINS}{kin.pk}/sessions/", format="json")

    assert response.status_code == 201
    assert response.json()["title"] == ""


def test_create_session_ignores_read_only_fields(api_client, kin):
    response = api_client.post(
        f"{KINS}{kin.pk}/sessions/", {"title": "T", "working_memory": "injected", "kin": 999_999}, format="json"
    )

    assert response.status_code == 201
    session = Session.objects.get(pk=response.json()["id"])
    assert session.working_memory == "" and session.kin == kin


def test_create_session_with_too_long_title_answers_400(api_client, kin):
    error = assert_api_error(api_client.post(f"{KINS}{kin.pk}/sessions/", {"title": "x" * 201}, format="json"), 400)

    assert "title" in error["details"]
    assert not Session.objects.exists()


def test_get_session_counts_messages(api_client, chat_session):
    MessageFactory.create_batch(3, session=chat_session)
    MessageFactory(session=SessionFactory(kin=chat_session.kin))

    response = api_client.get(f"/api/v1/sessions/{chat_session.pk}/")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == chat_session.pk
    assert body["kin"] == chat_session.kin_id
    assert body["title"] == chat_session.title
    assert body["message_count"] == 3
