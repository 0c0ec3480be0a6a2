"""Duplicating and archiving a workflow, from the API and the dashboard: a copy holds the same
graph and none of the runs, archiving only hides a workflow from the lists (it stays whole
and runs), PATCH takes nothing else, and on the dashboard only owners and admins may do
either (members get 403 and nothing changes)."""
import copy

import pytest
from django.urls import reverse

from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.sessions_app.test_api_access import assert_api_error
from workflows import services
from workflows.models import Node, Workflow, WorkflowRun

pytestmark = pytest.mark.django_db

API = "/api/v1/workflows/"
DOCUMENT = {
    "name": "Adults",
    "description": "People of age.",
    "nodes": [
        {"id": "people", "type": "inline_records", "label": "People", "position": {"x": 10, "y": 20},
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}]}},
        {"id": "adults", "type": "filter", "label": "Adults", "position": {"x": 200, "y": 20},
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
    ],
    "edges": [{"source": "people", "target": "adults"}],
}


@pytest.fixture
def workflow(team, django_capture_on_commit_callbacks):
    workflow = services.workflow_create(team=team, document=services.document_clean(copy.deepcopy(DOCUMENT)))
    with django_capture_on_commit_callbacks(execute=True):
        services.workflow_run_start(workflow=workflow)
    return workflow


def test_a_duplicate_has_the_graph_and_none_of_the_runs(api_client, workflow):
    response = api_client.post(f"{API}{workflow.pk}/duplicate/")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != workflow.pk and body["name"] == "Copy of Adults" and body["last_run"] is None
    original = api_client.get(f"{API}{workflow.pk}/", {"export": "1"}).json()
    duplicate = api_client.get(f"{API}{body['id']}/", {"export": "1"}).json()
    assert {**duplicate, "name": "Adults"} == original
    assert [node["status"] for node in body["nodes"]] == ["idle", "idle"]
    assert not WorkflowRun.objects.filter(workflow_id=body["id"]).exists()
    assert Node.objects.filter(workflow=workflow, status="done").count() == 2  # the original is untouched


def test_another_teams_workflow_cannot_be_duplicated_or_archived(api_client):
    other = services.workflow_create(team=TeamFactory(), document=services.document_clean(copy.deepcopy(DOCUMENT)))

    assert api_client.post(f"{API}{other.pk}/duplicate/").status_code == 404
    assert api_client.patch(f"{API}{other.pk}/", {"archived": True}, format="json").status_code == 404
    other.refresh_from_db()
    assert other.archived_at is None and Workflow.objects.count() == 1


def test_archiving_hides_a_workflow_from_the_filtered_lists_and_it_still_runs(api_client, workflow,
                                                                             django_capture_on_commit_callbacks):
    archived = api_client.patch(f"{API}{workflow.pk}/", {"archived": True}, format="json")
    assert archived.status_code == 200, archived.content
    assert archived.json()["archived_at"] is not None
    first_archived_at = archived.json()["archived_at"]
    again = api_client.patch(f"{API}{workflow.pk}/", {"archived": True}, format="json")
    assert again.json()["archived_at"] == first_archived_at  # again changes nothing

    def listed(**params):
        return [item["id"] for item in api_client.get(API, params).json()["results"]]

    assert listed() == [workflow.pk]
    assert listed(archived="true") == [workflow.pk] and listed(archived="false") == []
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.post(f"{API}{workflow.pk}/run/").status_code == 202

    back = api_client.patch(f"{API}{workflow.pk}/", {"archived": False}, format="json")
    assert back.json()["archived_at"] is None and listed(archived="false") == [workflow.pk]


@pytest.mark.parametrize("body", [{"name": "Renamed"}, {"archived": True, "nodes": []}, {}, {"archived": "maybe"}])
def test_a_patch_takes_only_archived_and_a_refused_one_changes_nothing(api_client, workflow, body):
    error = assert_api_error(api_client.patch(f"{API}{workflow.pk}/", body, format="json"), 400)

    assert error["details"]
    workflow.refresh_from_db()
    assert (workflow.name, workflow.archived_at) == ("Adults", None)


def test_a_put_of_the_detail_with_archived_at_is_taken(api_client, workflow):
    detail = api_client.patch(f"{API}{workflow.pk}/", {"archived": True}, format="json").json()
    detail["name"] = "Adults (v2)"

    response = api_client.put(f"{API}{workflow.pk}/", detail, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["archived_at"] == detail["archived_at"]  # read-only: PUT leaves it as it was


# --- the dashboard ----------------------------------------------------------------------------


@pytest.fixture
def member_client(client, team):
    member = UserFactory()
    MembershipFactory(team=team, user=member, role="member")
    client.force_login(member)
    return client


def test_an_owner_duplicates_and_archives_from_the_workflow_page(client, user, workflow):
    client.force_login(user)
    page = client.get(reverse("dashboard:workflow_detail", args=[workflow.pk])).content.decode()
    assert 'id="duplicate-workflow"' in page and 'id="archive-workflow"' in page

    response = client.post(reverse("dashboard:workflow_duplicate", args=[workflow.pk]))
    duplicate = Workflow.objects.exclude(pk=workflow.pk).get()
    assert response.status_code == 302 and response["Location"] == reverse("dashboard:workflow_detail",
                                                                           args=[duplicate.pk])
    assert duplicate.name == "Copy of Adults" and duplicate.nodes.count() == 2

    client.post(reverse("dashboard:workflow_archive", args=[workflow.pk]))
    workflow.refresh_from_db()
    assert workflow.archived_at is not None
    listing = client.get(reverse("dashboard:workflows")).content.decode()
    assert "Copy of Adults" in listing and ">Adults</a>" not in listing
    assert "Archived workflows (1)" in listing
    archived_listing = client.get(reverse("dashboard:workflows"), {"archived": "1"}).content.decode()
    assert ">Adults</a>" in archived_listing and "Copy of Adults" not in archived_listing
    detail = client.get(reverse("dashboard:workflow_detail", args=[workflow.pk])).content.decode()
    assert 'id="archived-state"' in detail and ">Unarchive</button>" in detail

    client.post(reverse("dashboard:workflow_archive", args=[workflow.pk]), {"archived": "0"})
    workflow.refresh_from_db()
    assert workflow.archived_at is None


def test_a_member_sees_no_buttons_and_is_refused(member_client, workflow):
    page = member_client.get(reverse("dashboard:workflow_detail", args=[workflow.pk])).content.decode()
    assert 'id="workflow-actions"' not in page and 'id="run-workflow"' in page  # members still run

    assert member_client.post(reverse("dashboard:workflow_duplicate", args=[workflow.pk])).status_code == 403
    assert member_client.post(reverse("dashboard:workflow_archive", args=[workflow.pk])).status_code == 403
    workflow.refresh_from_db()
    assert workflow.archived_at is None and Workflow.objects.count() == 1
