"""The memory tools as the model sees them: valid schemas, the exact toolsets, and
handlers that answer every bad argument with an "Error: ..." text, never an exception."""
import json

import pytest
from jsonschema import Draft202012Validator

from kinsite.tools import ToolContext
from memories import services
from memories.models import Memory, MemoryChange
from memories.services import Actor
from memories.tools import memory_toolset
from tests.factories import KinFactory, MemoryFactory, TeamFactory

# A private cache per test (private_cache, tests/memories/conftest.py).
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def context(team, kin):
    return ToolContext(team=team, kin=kin, actor=Actor(label=f"kin:{kin.pk} turn event:9"), source="tool",
                       source_ref="event:9")


def call(kind, name, context, arguments):
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return memory_toolset(kind)[name].handler(context, raw)


def ok(result: str) -> dict:
    assert not result.startswith("Error"), result
    return json.loads(result)


def add(context, content, **kwargs):
    return services.memory_add(team=context.team, kin=context.kin, content=content, actor=context.actor,
                               **kwargs).memory


# --- schemas and toolsets -----------------------------------------------------------------


def test_toolsets_hold_exactly_the_spec_tools():
    assert set(memory_toolset("kin")) == {"memory_recall", "memorize", "memory_update", "memory_forget"}
    assert set(memory_toolset("introspection")) == {"memory_recall", "memory_add", "memory_update", "memory_delete"}
    with pytest.raises(ValueError):
        memory_toolset("admin")


@pytest.mark.parametrize("kind", ["kin", "introspection"])
def test_schemas_are_valid_openai_functions(kind):
    for name, (schema, handler) in memory_toolset(kind).items():
        assert schema["name"] == name
        assert set(schema) == {"name", "description", "parameters"}
        assert schema["description"]
        Draft202012Validator.check_schema(schema["parameters"])
        parameters = schema["parameters"]
        assert parameters["type"] == "object" and parameters["additionalProperties"] is False
        assert set(parameters["required"]) <= set(parameters["properties"])
        assert callable(handler)
        json.dumps(schema)


# --- recall -------------------------------------------------------------------------------


def test_recall_returns_matching_memories_and_counts_retrieval(context):
    memory = add(context, "Maria prefers short answers", category="preference", subject="Maria", importance=8)
    add(context, "The build server is in Berlin")
    result = ok(call("kin", "memory_recall", context, {"query": "short answers"}))
    [found] = result["memories"]
    assert found["id"] == memory.pk and found["content"] == memory.content
    assert found["category"] == "preference" and found["subject"] == "Maria" and found["importance"] == 8
    assert found["shared"] is False and found["updated"] == "just now"
    memory.refresh_from_db()
    assert memory.retrieval_count == 1


def test_introspection_recall_does_not_count_retrieval(context):
    memory = add(context, "Maria prefers short answers")
    assert ok(call("introspection", "memory_recall", context, {"query": "answers", "limit": 3}))["memories"]
    memory.refresh_from_db()
    assert memory.retrieval_count == 0


def test_recall_with_category_and_nothing_found(context):
    add(context, "Coffee is free in the kitchen", category="fact")
    assert ok(call("kin", "memory_recall", context, {"query": "coffee", "category": "decision"})) == {"memories": []}
    assert ok(call("kin", "memory_recall", context, {"query": "!!!"})) == {"memories": []}


# --- memorize / memory_add ----------------------------------------------------------------


@pytest.mark.parametrize("kind, name", [("kin", "memorize"), ("introspection", "memory_add")])
def test_add_creates_then_merges(context, kind, name):
    args = {"content": "Maria prefers short answers", "category": "preference", "subject": "Maria", "importance": 7}
    first = ok(call(kind, name, context, args))
    assert first["status"] == "created"
    memory = Memory.objects.get(pk=first["memory"]["id"])
    assert memory.kin == context.kin and memory.source == "tool" and memory.source_ref == "event:9"
    assert MemoryChange.objects.get(memory=memory).actor == context.actor.label

    again = ok(call(kind, name, context, {"content": "maria prefers short answers!", "category": "preference"}))
    assert again["status"] == "merged_with_existing" and again["memory"]["id"] == memory.pk
    assert Memory.objects.filter(team=context.team).count() == 1


@pytest.mark.parametrize(
    "arguments, message",
    [
        ("not json", "not valid JSON"),
        ('["a list"]', "JSON object"),
        ({"category": "fact"}, "missing required argument(s): content"),
        ({"content": "x", "category": "fact", "mood": "happy"}, "unknown argument(s): mood"),
        ({"content": 42, "category": "fact"}, "content must be a string"),
        ({"content": "   ", "category": "fact"}, "content must not be empty"),
        ({"content": "x" * 5000, "category": "fact"}, "longer than"),
        ({"content": "x", "category": "gossip"}, "category must be one of"),
        ({"content": "x", "category": "fact", "importance": 11}, "between 1 and 10"),
        ({"content": "x", "category": "fact", "importance": 0}, "between 1 and 10"),
        ({"content": "x", "category": "fact", "importance": "7"}, "importance must be an integer"),
        ({"content": "x", "category": "fact", "importance": True}, "importance must be an integer"),
        ({"content": "x", "category": "fact", "importance": 7.5}, "importance must be an integer"),
        ({"content": "a\x00b", "category": "fact"}, "NUL"),
    ],
)
def test_memorize_rejects_bad_arguments_with_an_error_text(context, arguments, message):
    result = call("kin", "memorize", context, arguments)
    assert result.startswith("Error: ") and message in result
    assert not Memory.objects.exists()


def test_whole_number_float_importance_and_null_optionals_are_accepted(context):
    result = ok(call("kin", "memorize", context,
                     {"content": "Lena is on leave in May", "category": "fact", "importance": 6.0, "subject": None}))
    assert result["memory"]["importance"] == 6 and result["memory"]["subject"] == ""


# --- memory_update ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kin", "introspection"])
def test_update_changes_only_the_given_fields(context, kind):
    memory = add(context, "The deploy runs on Fridays", importance=4)
    result = ok(call(kind, "memory_update", context,
                     {"id": memory.pk, "content": "The deploy runs on Mondays", "reason": "moved"}))
    assert result["status"] == "updated"
    memory.refresh_from_db()
    assert memory.content == "The deploy runs on Mondays" and memory.importance == 4
    change = MemoryChange.objects.filter(memory=memory).latest("id")
    assert change.action == "update" and change.reason == "moved" and change.actor == context.actor.label


def test_update_refuses_memories_it_may_not_change(context, team):
    other_kin_memory = MemoryFactory(team=team, kin=KinFactory(team=team), content="other kin")
    other_team_memory = MemoryFactory(kin=KinFactory(team=TeamFactory()), content="other team")
    shared = MemoryFactory(team=team, kin=None, content="shared")
    deleted = MemoryFactory(team=team, kin=context.kin, content="gone", status=Memory.Status.DELETED)
    for memory_id in (other_kin_memory.pk, other_team_memory.pk, shared.pk, deleted.pk, 999_999):
        result = call("kin", "memory_update", context, {"id": memory_id, "importance": 9})
        assert result.startswith("Error: no active memory"), result
    assert not MemoryChange.objects.exists()
    assert Memory.objects.filter(importance=9).count() == 0


def test_update_needs_an_id_and_a_field(context):
    memory = add(context, "The deploy runs on Fridays")
    assert call("kin", "memory_update", context, {"content": "x"}).startswith("Error: missing required argument(s): id")
    assert call("kin", "memory_update", context, {"id": "abc"}).startswith("Error: id must be an integer")
    # An id has a minimum and no maximum: the message names the one bound there is.
    assert call("kin", "memory_update", context, {"id": 0, "importance": 5}) == "Error: id must be at least 1."
    assert "at least one of" in call("kin", "memory_update", context, {"id": memory.pk, "reason": "why"})
    assert "category must be one of" in call("kin", "memory_update", context, {"id": memory.pk, "category": "x"})
    assert MemoryChange.objects.filter(memory=memory).count() == 1


# --- memory_forget / memory_delete --------------------------------------------------------


@pytest.mark.parametrize("kind, name", [("kin", "memory_forget"), ("introspection", "memory_delete")])
def test_forget_deletes_and_keeps_history(context, kind, name):
    memory = add(context, "The wifi password is hunter2")
    result = ok(call(kind, name, context, {"id": memory.pk, "reason": "rotated"}))
    assert result == {"status": "deleted", "id": memory.pk}
    memory.refresh_from_db()
    assert memory.status == "deleted"
    assert [c.action for c in MemoryChange.objects.filter(memory=memory).order_by("id")] == ["add", "delete"]
    # A second forget finds nothing active.
    assert call(kind, name, context, {"id": memory.pk, "reason": "again"}).startswith("Error: no active memory")


def test_forget_needs_a_reason(context):
    memory = add(context, "The wifi password is hunter2")
    assert "missing required argument(s): reason" in call("kin", "memory_forget", context, {"id": memory.pk})
    assert "reason must not be empty" in call("kin", "memory_forget", context, {"id": memory.pk, "reason": " "})
    memory.refresh_from_db()
    assert memory.status == "active"


def test_empty_arguments_string_is_a_missing_argument_error(context):
    assert call("kin", "memory_recall", context, "").startswith("Error: missing required argument(s): query")
