"""Every API endpoint refuses callers without a valid token (401) and hides other
teams' objects (404), both in the error shape of SPEC §11.

ENDPOINTS is the list of every route under /api/v1/; the guard test at the end
fails when a route exists that is not listed, so a new endpoint must be added here
(and so gets the same checks)."""
import re
from dataclasses import dataclass

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from erasure.models import Erasure
from kinsite.models import Kin
from kinsite.services import api_token_issue, api_token_revoke
from memories.models import Memory, MemoryChange
from sessions_app.models import Event, Session, Turn
from tests.factories import (
    ConsolidationRunFactory,
    ExperienceVersionFactory,
    FactFactory,
    KinFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    NodeFactory,
    SessionFactory,
    TurnFactory,
    WorkflowFactory,
)
from workflows.models import Node, NodeRun, Workflow

API_PREFIX = "/api/v1/"
# Routes that are public by design and have no team data.
UNGUARDED_ROUTES = {"schema/", "schema/docs/", "schema/redoc/"}

SECRET = "zanzibar"  # a word only the seeded objects contain


def assert_api_error(response, status: int, code: str | None = None) -> dict:
    """The response has `status` and the §11 error shape; returns the error object."""
    assert response.status_code == status, response.content[:500]
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], (dict, list))
    if code is not None:
        assert error["code"] == code
    return error


@dataclass(frozen=True)
class Endpoint:
    method: str
    route: str  # under /api/v1/, "{id}" for the object id
    owner: str | None = None  # "kin", "session", "memory" or "turn": whose id fills {id}
    body: dict | list | None = None
    query: str = ""

    def url(self, object_id=None) -> str:
        url = API_PREFIX + self.route.format(id=object_id)
        return f"{url}?{self.query}" if self.query else url

    def call(self, client: APIClient, object_id=None):
        return getattr(client, self.method.lower())(self.url(object_id), data=self.body, format="json")

    def __str__(self):
        return f"{self.method} {self.route}"


ENDPOINTS = [
    Endpoint("GET", "kins/"),
    Endpoint("POST", "kins/", body={"name": "New kin"}),
    Endpoint("GET", "kins/{id}/", "kin"),
    Endpoint("PATCH", "kins/{id}/", "kin", body={"name": "Renamed"}),
    Endpoint("DELETE", "kins/{id}/", "kin"),
    Endpoint("GET", "kins/{id}/sessions/", "kin"),
    Endpoint("POST", "kins/{id}/sessions/", "kin", body={"title": "New session"}),
    Endpoint("GET", "kins/{id}/history/search/", "kin", query=f"q={SECRET}"),
    Endpoint("GET", "kins/{id}/export/", "kin", query="sessions=1"),
    Endpoint("POST", "kins/import/", body={"format": "kinsite.kin", "version": 1}),
    Endpoint("GET", "sessions/{id}/", "session"),
    Endpoint("PATCH", "sessions/{id}/", "session", body={"title": "Renamed", "archived": True}),
    Endpoint("GET", "sessions/{id}/messages/", "session"),
    Endpoint(
        "POST",
        "sessions/{id}/messages/import/",
        "session",
        body={"messages": [{"content": "imported", "external_id": "import-1"}]},
    ),
    Endpoint("GET", "sessions/{id}/history/search/", "session", query=f"q={SECRET}"),
    Endpoint("POST", "sessions/{id}/messages/", "session", body={"content": "hello", "sender": "Maria"}),
    Endpoint("GET", "sessions/{id}/prompt/", "session", query=f"message={SECRET}"),
    Endpoint("POST", "sessions/{id}/checkpoint/", "session"),
    Endpoint("GET", "sessions/{id}/introspections/", "session"),
    Endpoint("GET", "turns/{id}/", "turn"),
    Endpoint("GET", "turns/{id}/events/", "turn"),
    Endpoint("POST", "turns/{id}/retry/", "turn"),
    Endpoint("GET", "kins/{id}/memories/", "kin"),
    Endpoint("POST", "kins/{id}/memories/", "kin", body={"content": "A new memory.", "category": "fact"}),
    Endpoint("GET", "kins/{id}/memories/search/", "kin", query=f"q={SECRET}"),
    Endpoint("GET", "memories/{id}/", "memory"),
    Endpoint("PATCH", "memories/{id}/", "memory", body={"content": "Rewritten."}),
    Endpoint("DELETE", "memories/{id}/", "memory"),
    Endpoint("GET", "memories/{id}/history/", "memory"),
    Endpoint("GET", "kins/{id}/facts/", "kin"),
    Endpoint("POST", "kins/{id}/facts/", "kin", body={"statement": "A new fact.", "category": "fact"}),
    Endpoint("POST", "kins/{id}/consolidate/", "kin", body={"prepare": True}),
    Endpoint("GET", "kins/{id}/consolidations/", "kin"),
    Endpoint("GET", "kins/{id}/experience/", "kin"),
    Endpoint("GET", "workflows/"),
    Endpoint("POST", "workflows/", body={"name": "New workflow", "nodes": [], "edges": []}),
    Endpoint("GET", "workflows/{id}/", "workflow"),
    Endpoint(
        "PUT",
        "workflows/{id}/",
        "workflow",
        body={"name": "Replaced", "nodes": [{"id": "src", "type": "inline_records", "config": {"records": []}}]},
    ),
    Endpoint("PATCH", "workflows/{id}/", "workflow", body={"archived": True}),
    Endpoint("DELETE", "workflows/{id}/", "workflow"),
    Endpoint("POST", "workflows/{id}/run/", "workflow"),
    Endpoint("POST", "workflows/{id}/duplicate/", "workflow"),
    Endpoint("GET", "workflow-node-types/"),
    # Both placeholders get the workflow's id; the node part never matters (the workflow is checked first).
    Endpoint("GET", "workflows/{id}/nodes/{id}/lineage/", "workflow", query="format=narrative"),
    Endpoint("GET", "erasures/"),
    Endpoint("POST", "erasures/", body={"sender": "Maria", "dry_run": True}),
    Endpoint("GET", "erasures/{id}/", "erasure"),
]
OWNER_MODELS = {"kin": Kin, "session": Session, "memory": Memory, "turn": Turn, "workflow": Workflow,
                "erasure": Erasure}
OWNED_ENDPOINTS = [endpoint for endpoint in ENDPOINTS if endpoint.owner]


@pytest.fixture
def seeded(team):
    """A kin of `team` with a session, a message (with its turn) and a memory, all containing SECRET."""
    kin = KinFactory(team=team, name=f"Kin {SECRET}")
    session = SessionFactory(kin=kin, title=f"Session {SECRET}")
    message = MessageFactory(session=session, content=f"the {SECRET} plan", external_id="seed-1")
    turn = TurnFactory(session=session, user_message=message, status=Turn.Status.FAILED, error=SECRET)
    memory = _memory(team, kin, f"The {SECRET} plan is due in May.")
    workflow = _workflow(team, f"Workflow {SECRET}")
    erasure = Erasure.objects.create(team=team, sender=f"Person {SECRET}", actor="user:test")
    return {"kin": kin, "session": session, "memory": memory, "turn": turn, "workflow": workflow, "erasure": erasure}


@pytest.fixture
def foreign(other_team):
    """The same as `seeded`, for another team."""
    kin = KinFactory(team=other_team, name=f"Foreign {SECRET}")
    session = SessionFactory(kin=kin, title=f"Foreign session {SECRET}")
    message = MessageFactory(session=session, content=f"the foreign {SECRET} plan", external_id="foreign-1")
    turn = TurnFactory(session=session, user_message=message, status=Turn.Status.FAILED, error=SECRET)
    memory = _memory(other_team, kin, f"Foreign: the {SECRET} plan is secret.")
    workflow = _workflow(other_team, f"Foreign workflow {SECRET}")
    FactFactory(kin=kin, statement=f"Foreign: the {SECRET} fact.", source=Fact.Source.API)
    run = ConsolidationRunFactory(kin=kin, trigger="api", status="applied", summary_of_changes=SECRET)
    ExperienceVersionFactory(kin=kin, version=1, markdown=f"# Master AI Experience\n- {SECRET}", run=run)
    erasure = Erasure.objects.create(team=other_team, sender=f"Foreign {SECRET}", actor="user:test")
    return {"kin": kin, "session": session, "memory": memory, "turn": turn, "workflow": workflow, "erasure": erasure}


def _workflow(team, name) -> Workflow:
    workflow = WorkflowFactory(team=team, name=name)
    # The node's client id is the workflow's id, so the lineage route (both ids the same) finds it.
    NodeFactory(
        workflow=workflow, client_id=str(workflow.pk), type="inline_records",
        label=f"Records {SECRET}", config={"records": [{"note": SECRET}]},
    )
    return workflow


def _memory(team, kin, content) -> Memory:
    # Rows made directly: these tests are about access, not about memory_add's duplicate lookup.
    memory = MemoryFactory(team=team, kin=kin, content=content, category=Memory.Category.FACT)
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.ADD, after={"content": content}, actor="test")
    return memory


def _snapshot():
    return (
        list(Kin.objects.order_by("id").values_list("id", "name", "parent_id")),
        list(Session.objects.order_by("id").values_list("id", "title")),
        Event.objects.count(),
        list(Turn.objects.order_by("id").values_list("id", "status")),
        list(Memory.objects.order_by("id").values_list("id", "content", "status", "importance")),
        MemoryChange.objects.count(),
        list(Fact.objects.order_by("id").values_list("id", "statement", "status", "is_consolidated")),
        list(ConsolidationRun.objects.order_by("id").values_list("id", "status")),
        ExperienceVersion.objects.count(),
        list(Workflow.objects.order_by("id").values_list("id", "name")),
        list(Node.objects.order_by("id").values_list("id", "client_id", "type", "status", "config")),
        NodeRun.objects.count(),
    )


def _unauthenticated_client(kind: str, team) -> APIClient:
    client = APIClient()
    if kind == "missing":
        return client
    if kind == "wrong":
        header = "Bearer ks_this-token-was-never-issued"
    elif kind == "revoked":
        token, raw = api_token_issue(team=team, name="revoked")
        api_token_revoke(token=token)
        header = f"Bearer {raw}"
    elif kind == "bearer_without_token":
        header = "Bearer"
    elif kind == "other_scheme":
        _, raw = api_token_issue(team=team, name="valid but wrong scheme")
        header = f"Token {raw}"
    else:
        raise AssertionError(kind)
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


@pytest.mark.parametrize("auth", ["missing", "wrong", "revoked", "bearer_without_token", "other_scheme"])
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_endpoint_without_valid_token_answers_401(endpoint, auth, team, seeded):
    client = _unauthenticated_client(auth, team)
    object_id = seeded[endpoint.owner].pk if endpoint.owner else None
    before = _snapshot()

    response = endpoint.call(client, object_id)

    assert_api_error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert SECRET not in response.content.decode()
    assert _snapshot() == before


@pytest.mark.parametrize("target", ["other_team", "missing"])
@pytest.mark.parametrize("endpoint", OWNED_ENDPOINTS, ids=str)
def test_endpoint_with_another_teams_id_answers_404(endpoint, target, api_client, seeded, foreign):
    if target == "other_team":
        object_id = foreign[endpoint.owner].pk
    else:
        model = OWNER_MODELS[endpoint.owner]
        object_id = model.objects.order_by("-id").values_list("id", flat=True).first() + 1000
    before = _snapshot()

    response = endpoint.call(api_client, object_id)

    assert_api_error(response, 404, code="not_found")
    body = response.content.decode()
    assert SECRET not in body and "Foreign" not in body
    assert _snapshot() == before


def test_kin_list_shows_only_own_team(api_client, seeded, foreign):
    response = api_client.get(API_PREFIX + "kins/")

    assert response.status_code == 200
    assert [kin["id"] for kin in response.json()["results"]] == [seeded["kin"].pk]
    assert "Foreign" not in response.content.decode()


def test_kin_history_search_ignores_other_teams_messages(api_client, seeded, foreign):
    response = api_client.get(API_PREFIX + f"kins/{seeded['kin'].pk}/history/search/?q={SECRET}")

    assert response.status_code == 200
    assert [hit["external_id"] for hit in response.json()["results"]] == ["seed-1"]


# --- guard: every /api/v1/ route is listed above ---------------------------------

_REGEX_GROUP = re.compile(r"\(\?P<\w+>[^)]*\)")
_PATH_CONVERTER = re.compile(r"<(?:\w+:)?\w+>")


def _normalise(route: str) -> str:
    route = route.replace("^", "").replace("$", "")
    route = _REGEX_GROUP.sub("{id}", route)
    return _PATH_CONVERTER.sub("{id}", route)


def _walk(patterns, prefix=""):
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


def _methods(callback) -> set[str]:
    if getattr(callback, "actions", None):  # a viewset route: method -> action
        allowed = set(callback.cls.http_method_names) - {"head", "options"}
        return {method.upper() for method in callback.actions if method in allowed}
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    assert view_class is not None, f"cannot tell the methods of {callback!r}"
    return {
        method.upper()
        for method in view_class.http_method_names
        if method not in ("head", "options") and hasattr(view_class, method)
    }


def _api_routes() -> set[tuple[str, str]]:
    routes = set()
    for route, callback in _walk(get_resolver().url_patterns):
        route = _normalise(route)
        if not route.startswith(API_PREFIX.lstrip("/")):
            continue
        route = route[len(API_PREFIX) - 1 :]
        if route in UNGUARDED_ROUTES:
            continue
        routes.update((method, route) for method in _methods(callback))
    return routes


def test_every_api_route_is_covered_by_the_access_tests():
    listed = {(endpoint.method, endpoint.route) for endpoint in ENDPOINTS}
    existing = _api_routes()

    assert existing - listed == set(), "add these endpoints to ENDPOINTS in this file"
    assert listed - existing == set(), "these ENDPOINTS no longer exist"
