"""The memories API (SPEC §11): a kin's memories (list, filters, pagination, add
with the duplicate contract), one memory (read, edit, delete as a status change),
its history, and memory search. Access checks for every route (401, other teams'
ids → 404) live in tests/sessions_app/test_api_access.py."""
import pytest

from kinsite.models import ApiToken
from memories import services
from memories.models import Memory, MemoryChange
from tests.factories import KinFactory

pytestmark = pytest.mark.django_db

API = "/api/v1/"
MEMORY_FIELDS = {
    "id",
    "kin",
    "shared",
    "category",
    "content",
    "subject",
    "importance",
    "status",
    "source",
    "source_ref",
    "superseded_by",
    "retrieval_count",
    "last_retrieved_at",
    "created_at",
    "updated_at",
}


# Different enough that the duplicate check keeps them apart.
DISTINCT_CONTENTS = [
    "The warehouse is in Leeds.",
    "Maria prefers weekly reports.",
    "Invoices are sent on the first working day.",
    "Staging databases are refreshed every Sunday night.",
    "Customer names must never appear in logs.",
]


def add_memory(team, kin, content, **fields) -> Memory:
    return services.memory_add(team=team, kin=kin, content=content, actor=services.Actor("test"), **fields).memory


def memories_snapshot():
    return (
        list(Memory.objects.order_by("id").values_list("id", "content", "category", "subject", "importance", "status")),
        MemoryChange.objects.count(),
    )


@pytest.fixture
def token(api_client):
    return ApiToken.objects.get(name="test")


# --- add ------------------------------------------------------------------------


def test_post_adds_a_memory_for_the_kin(api_client, kin, token, user):
    response = api_client.post(
        f"{API}kins/{kin.pk}/memories/",
        {"content": "Maria prefers weekly reports.", "category": "preference", "subject": "Maria", "importance": 7},
        format="json",
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == MEMORY_FIELDS | {"created"}
    assert body["created"] is True
    assert body["kin"] == kin.pk and body["shared"] is False
    assert body["status"] == "active"
    memory = Memory.objects.get(pk=body["id"])
    assert (memory.content, memory.category, memory.subject, memory.importance) == (
        "Maria prefers weekly reports.",
        "preference",
        "Maria",
        7,
    )
    assert (memory.source, memory.source_ref) == ("api", f"token:{token.prefix}")
    change = memory.changes.get()
    assert change.action == "add"
    assert change.actor == f"token:{token.prefix}"
    assert change.actor_user == user


def test_post_with_shared_adds_a_team_memory(api_client, kin, team):
    response = api_client.post(
        f"{API}kins/{kin.pk}/memories/", {"content": "The office closes at six.", "category": "fact", "shared": True},
        format="json",
    )

    assert response.status_code == 201
    assert response.json()["kin"] is None and response.json()["shared"] is True
    assert Memory.objects.get(pk=response.json()["id"]).team == team


def test_duplicate_memory_updates_existing_and_answers_200(api_client, kin):
    url = f"{API}kins/{kin.pk}/memories/"
    first = api_client.post(
        url, {"content": "Deploys happen on Tuesdays.", "category": "fact", "importance": 8}, format="json"
    )
    second = api_client.post(
        url, {"content": "Deploys happen on Tuesdays.", "category": "decision", "importance": 3}, format="json"
    )

    assert first.status_code == 201 and second.status_code == 200
    body = second.json()
    assert body["created"] is False
    assert body["id"] == first.json()["id"]
    assert body["category"] == "decision"
    assert body["importance"] == 8  # the higher importance is kept
    assert Memory.objects.count() == 1
    assert list(MemoryChange.objects.order_by("id").values_list("action", flat=True)) == ["add", "update"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"category": "fact"}, "content"),
        ({"content": "", "category": "fact"}, "content"),
        ({"content": "   \n ", "category": "fact"}, "content"),
        ({"content": "x" * 10_001, "category": "fact"}, "content"),
        ({"content": "ok"}, "category"),
        ({"content": "ok", "category": "gossip"}, "category"),
        ({"content": "ok", "category": "fact", "importance": 0}, "importance"),
        ({"content": "ok", "category": "fact", "importance": 11}, "importance"),
        ({"content": "ok", "category": "fact", "importance": "high"}, "importance"),
        ({"content": "ok", "category": "fact", "subject": "s" * 201}, "subject"),
        ({"content": "ok", "category": "fact", "shared": "maybe"}, "shared"),
        ({"content": "ok", "category": "fact", "status": "deleted"}, "status"),
        ({"content": "ok", "category": "fact", "kin": 1}, "kin"),
    ],
)
def test_post_with_invalid_input_answers_400_and_adds_nothing(api_client, kin, body, field):
    before = memories_snapshot()

    response = api_client.post(f"{API}kins/{kin.pk}/memories/", body, format="json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["details"]
    assert memories_snapshot() == before


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "{not json", "null"])
def test_post_with_a_body_that_is_not_an_object_answers_400(api_client, kin, raw):
    response = api_client.generic("POST", f"{API}kins/{kin.pk}/memories/", raw, content_type="application/json")

    assert response.status_code == 400
    assert set(response.json()) == {"error"}
    assert Memory.objects.count() == 0


# --- list -----------------------------------------------------------------------


@pytest.fixture
def mixed(team, kin):
    """The kin's own memories, a team-shared one, another kin's, a deleted one."""
    own_fact = add_memory(team, kin, "The warehouse is in Leeds.", category="fact", subject="warehouse")
    own_pref = add_memory(team, kin, "Answers in British English.", category="preference")
    shared = add_memory(team, None, "The team uses PostgreSQL.", category="knowledge")
    other_kin = add_memory(team, KinFactory(team=team), "Someone else's memory.", category="fact")
    deleted = add_memory(team, kin, "An outdated address.", category="fact", subject="warehouse")
    services.memory_delete(memory=deleted, actor=services.Actor("test"))
    return {"own_fact": own_fact, "own_pref": own_pref, "shared": shared, "other_kin": other_kin, "deleted": deleted}


def ids(response):
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_list_shows_the_kins_active_and_shared_memories_newest_first(api_client, kin, mixed):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/")

    assert ids(response) == [mixed["shared"].pk, mixed["own_pref"].pk, mixed["own_fact"].pk]
    assert set(response.json()["results"][0]) == MEMORY_FIELDS


@pytest.mark.parametrize(
    "query, expected",
    [
        ("category=fact", ["own_fact"]),
        ("category=knowledge", ["shared"]),
        ("status=deleted", ["deleted"]),
        ("status=all", ["deleted", "shared", "own_pref", "own_fact"]),
        ("subject=WAREHOUSE", ["own_fact"]),
        ("subject=warehouse&status=all", ["deleted", "own_fact"]),
        ("scope=kin", ["own_pref", "own_fact"]),
        ("scope=shared", ["shared"]),
        ("category=decision", []),
    ],
)
def test_list_filters(api_client, kin, mixed, query, expected):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/?{query}")

    assert ids(response) == [mixed[name].pk for name in expected]


@pytest.mark.parametrize("query", ["category=gossip", "status=gone", "scope=everyone", "subject=" + "s" * 201])
def test_list_with_an_invalid_filter_answers_400(api_client, kin, mixed, query):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/?{query}")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_list_is_cursor_paginated(api_client, team, kin):
    created = [add_memory(team, kin, content).pk for content in DISTINCT_CONTENTS]

    seen, url = [], f"{API}kins/{kin.pk}/memories/?limit=2"
    while url:
        response = api_client.get(url)
        assert response.status_code == 200
        assert len(response.json()["results"]) <= 2
        seen += [row["id"] for row in response.json()["results"]]
        url = response.json()["next"]

    assert seen == list(reversed(created))


def test_list_with_a_broken_cursor_answers_400(api_client, kin):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/?cursor=not-a-cursor")

    assert response.status_code == 400


# --- one memory -----------------------------------------------------------------


def test_get_returns_the_memory(api_client, team, kin):
    memory = add_memory(team, kin, "Invoices go out on the 1st.", category="fact")

    response = api_client.get(f"{API}memories/{memory.pk}/")

    assert response.status_code == 200
    assert response.json()["content"] == "Invoices go out on the 1st."
    assert set(response.json()) == MEMORY_FIELDS


def test_patch_updates_fields_and_records_a_change(api_client, team, kin, token, user):
    memory = add_memory(team, kin, "Invoices go out on the 1st.", category="fact", importance=4)

    response = api_client.patch(
        f"{API}memories/{memory.pk}/",
        {"content": "Invoices go out on the 2nd.", "importance": 9, "reason": "Policy changed."},
        format="json",
    )

    assert response.status_code == 200, response.content
    assert response.json()["content"] == "Invoices go out on the 2nd."
    memory.refresh_from_db()
    assert (memory.content, memory.importance, memory.category) == ("Invoices go out on the 2nd.", 9, "fact")
    change = memory.changes.order_by("id").last()
    assert change.action == "update"
    assert change.before["content"] == "Invoices go out on the 1st."
    assert change.after["content"] == "Invoices go out on the 2nd."
    assert (change.actor, change.actor_user, change.reason) == (f"token:{token.prefix}", user, "Policy changed.")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": "only a reason"},
        {"content": ""},
        {"content": "  "},
        {"content": "x" * 10_001},
        {"category": "rumour"},
        {"importance": 42},
        {"status": "active"},
        {"source": "admin"},
        {"reason": "r" * 1_001, "content": "fine"},
    ],
)
def test_patch_with_invalid_input_answers_400_and_changes_nothing(api_client, team, kin, body):
    memory = add_memory(team, kin, "Invoices go out on the 1st.")
    before = memories_snapshot()

    response = api_client.patch(f"{API}memories/{memory.pk}/", body, format="json")

    assert response.status_code == 400, response.content
    assert set(response.json()) == {"error"}
    assert memories_snapshot() == before


def test_delete_is_a_status_change_and_keeps_history(api_client, team, kin, token):
    memory = add_memory(team, kin, "The old office is on Main Street.")

    response = api_client.delete(f"{API}memories/{memory.pk}/")

    assert response.status_code == 204
    assert response.content == b""
    still_there = api_client.get(f"{API}memories/{memory.pk}/")
    assert still_there.status_code == 200
    assert still_there.json()["status"] == "deleted"
    assert still_there.json()["content"] == "The old office is on Main Street."
    history = api_client.get(f"{API}memories/{memory.pk}/history/").json()["results"]
    assert [row["action"] for row in history] == ["add", "delete"]
    assert history[1]["actor"] == f"token:{token.prefix}"
    assert history[1]["before"]["status"] == "active" and history[1]["after"]["status"] == "deleted"
    assert ids(api_client.get(f"{API}kins/{kin.pk}/memories/")) == []


def test_deleting_twice_answers_204_and_records_one_change(api_client, team, kin):
    memory = add_memory(team, kin, "Temporary note.")

    assert api_client.delete(f"{API}memories/{memory.pk}/").status_code == 204
    assert api_client.delete(f"{API}memories/{memory.pk}/").status_code == 204

    assert list(memory.changes.values_list("action", flat=True)) == ["add", "delete"]


def test_patch_of_a_deleted_memory_answers_409_and_changes_nothing(api_client, team, kin):
    memory = add_memory(team, kin, "Temporary note.")
    services.memory_delete(memory=memory, actor=services.Actor("test"))
    before = memories_snapshot()

    response = api_client.patch(f"{API}memories/{memory.pk}/", {"content": "Revived"}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict"
    assert memories_snapshot() == before


def test_shared_memory_is_readable_by_id(api_client, team):
    memory = add_memory(team, None, "Team-wide: the fiscal year starts in April.")

    response = api_client.get(f"{API}memories/{memory.pk}/")

    assert response.status_code == 200 and response.json()["shared"] is True


def test_another_teams_memory_answers_404_everywhere(api_client, other_team):
    foreign_kin = KinFactory(team=other_team)
    memory = add_memory(other_team, foreign_kin, "Foreign secret.")
    before = memories_snapshot()

    for method, url, body in [
        ("get", f"{API}memories/{memory.pk}/", None),
        ("patch", f"{API}memories/{memory.pk}/", {"content": "hijacked"}),
        ("delete", f"{API}memories/{memory.pk}/", None),
        ("get", f"{API}memories/{memory.pk}/history/", None),
        ("get", f"{API}kins/{foreign_kin.pk}/memories/", None),
        ("post", f"{API}kins/{foreign_kin.pk}/memories/", {"content": "planted", "category": "fact"}),
        ("get", f"{API}kins/{foreign_kin.pk}/memories/search/?q=secret", None),
    ]:
        response = getattr(api_client, method)(url, body, format="json")
        assert response.status_code == 404, (method, url)
        assert "Foreign" not in response.content.decode()
    assert memories_snapshot() == before


# --- history --------------------------------------------------------------------


def test_history_lists_changes_oldest_first(api_client, team, kin, token):
    memory = add_memory(team, kin, "Version one.", reason="first seen")
    api_client.patch(f"{API}memories/{memory.pk}/", {"content": "Version two."}, format="json")
    api_client.patch(f"{API}memories/{memory.pk}/", {"subject": "versions", "reason": "tagging"}, format="json")

    response = api_client.get(f"{API}memories/{memory.pk}/history/")

    assert response.status_code == 200
    rows = response.json()["results"]
    assert [row["action"] for row in rows] == ["add", "update", "update"]
    assert set(rows[0]) == {"id", "action", "before", "after", "actor", "reason", "created_at"}
    assert rows[0]["before"] == {} and rows[0]["after"]["content"] == "Version one."
    assert rows[0]["actor"] == "test" and rows[0]["reason"] == "first seen"
    assert rows[1]["before"]["content"] == "Version one." and rows[1]["after"]["content"] == "Version two."
    assert rows[2]["after"]["subject"] == "versions" and rows[2]["reason"] == "tagging"
    assert rows[2]["actor"] == f"token:{token.prefix}"


# --- search ---------------------------------------------------------------------


@pytest.fixture
def searchable(team, kin):
    return {
        "deploy": add_memory(
            team, kin, "Production deploys happen on Tuesday mornings.", category="decision", importance=8
        ),
        "coffee": add_memory(team, kin, "Maria drinks her coffee black.", category="preference", subject="Maria"),
        "shared": add_memory(team, None, "The deploy pipeline runs on GitHub Actions.", category="knowledge"),
        "other": add_memory(team, KinFactory(team=team), "Another kin's deploy notes.", category="fact"),
    }


def test_search_returns_ranked_memories_with_score_and_components(api_client, kin, searchable):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/search/?q=deploy&limit=5")

    assert response.status_code == 200, response.content
    results = response.json()["results"]
    found = [row["id"] for row in results]
    assert searchable["deploy"].pk in found and searchable["shared"].pk in found
    assert searchable["coffee"].pk not in found and searchable["other"].pk not in found
    for row in results:
        assert set(row) == MEMORY_FIELDS | {"score", "components"}
        assert isinstance(row["score"], float)
        assert row["components"] and all(isinstance(value, (int, float)) for value in row["components"].values())
    scores = [row["score"] for row in results]
    assert scores == sorted(scores, reverse=True)


def test_search_does_not_return_deleted_memories(api_client, kin, searchable):
    services.memory_delete(memory=searchable["deploy"], actor=services.Actor("test"))

    response = api_client.get(f"{API}kins/{kin.pk}/memories/search/?q=deploy")

    assert searchable["deploy"].pk not in [row["id"] for row in response.json()["results"]]


def test_search_respects_limit(api_client, team, kin):
    for content in DISTINCT_CONTENTS:
        add_memory(team, kin, f"{content} Checked by the pipeline.")

    response = api_client.get(f"{API}kins/{kin.pk}/memories/search/?q=pipeline&limit=2")

    assert response.status_code == 200
    assert len(response.json()["results"]) == 2


@pytest.mark.parametrize(
    "q",
    [
        "",
        "   ",
        '"unbalanced',
        "deploy AND OR NOT",
        "NEAR(deploy coffee)",
        "deploy*",
        "-coffee",
        "content:deploy",
        "'; DROP TABLE memories_memory; --",
        "(((",
        "!@#$%^&*()",
        "Tuesday's déploiement 日本語 🚀",
        "a" * 5_000,
    ],
)
def test_odd_search_input_answers_200(api_client, kin, searchable, q):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/search/", {"q": q})

    assert response.status_code == 200, response.content
    assert isinstance(response.json()["results"], list)


@pytest.mark.parametrize(
    "query",
    ["", "q=deploy&limit=0", "q=deploy&limit=101", "q=deploy&limit=ten", "q=" + "a" * 5_001],
)
def test_invalid_search_parameters_answer_400(api_client, kin, searchable, query):
    response = api_client.get(f"{API}kins/{kin.pk}/memories/search/?{query}")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
