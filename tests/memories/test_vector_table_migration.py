"""Memories 0008/0009: vectors move from memories_memory.embedding to memories_memoryvector.
A database at 0007 with vectors migrates forward with every vector, the column gone, and
the triggers of 0002 (SQLite full-text) and 0006 (vector generations) still there and
working, plus the vector table's; and it migrates back with its vectors. The test
migrates this test database back to 0007 and always ends at the newest migrations."""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from memories import ranking, services
from memories.embeddings import Embedding
from memories.models import Memory, MemoryVector
from memories.search import vectors
from memories.search.selectors import memory_search
from tests.support.scripted_model import hashed_bag_of_words

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("private_cache")]

BEFORE = [("memories", "0007_embedding_runs")]
MODEL = "scripted-embedding"
ACTOR = services.Actor(label="test")

# The triggers each database must have after migrating (PostgreSQL's full-text index is a
# generated column, not a trigger).
SQLITE_TRIGGERS = {
    "memories_memory_fts_insert", "memories_memory_fts_delete", "memories_memory_fts_update",
    "memories_memory_vector_insert", "memories_memory_vector_move", "memories_memory_vector_update",
    "memories_memory_vector_delete",
    "memories_memoryvector_insert", "memories_memoryvector_update", "memories_memoryvector_delete",
}
PG_TRIGGERS = {"memories_memory_vector_seq", "memories_memoryvector_touch"}


def migrate(targets):
    MigrationExecutor(connection).migrate(targets)


def migrate_to_newest():
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def old_models():
    return MigrationExecutor(connection)._create_project_state(with_applied_migrations=True).apps


def memory_columns() -> set[str]:
    with connection.cursor() as cursor:
        return {column.name for column in connection.introspection.get_table_description(cursor, "memories_memory")}


def triggers() -> set[str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
                           " AND tgrelid IN ('memories_memory'::regclass, 'memories_memoryvector'::regclass)")
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"
                           " AND tbl_name IN ('memories_memory', 'memories_memoryvector')")
        return {name for (name,) in cursor.fetchall()}


def vector(text: str) -> bytes:
    return ranking.vector_to_bytes(hashed_bag_of_words(text))


def nearest(team, kin, text, k=5):
    return vectors.nearest(team=team, kin=kin, include_shared=False, k=k,
                           embedding=Embedding(vector=tuple(hashed_bag_of_words(text)), model=MODEL))


def texts_found(team, kin, query):
    return {hit.memory.content for hit in memory_search(team=team, kin=kin, query=query, limit=10)}


def test_vectors_move_out_and_back_and_every_trigger_survives(team, kin):
    try:
        migrate(BEFORE)
        OldMemory = old_models().get_model("memories", "Memory")
        parked = OldMemory.objects.create(team_id=team.pk, kin_id=kin.pk, content="The automobile is parked downstairs",
                                          embedding=vector("automobile parked downstairs"), embedding_model=MODEL)
        lunch = OldMemory.objects.create(team_id=team.pk, kin_id=kin.pk, content="Lunch is served at noon")
    finally:
        migrate_to_newest()

    assert "embedding" not in memory_columns()
    assert bytes(MemoryVector.objects.get(memory_id=parked.pk).vector) == vector("automobile parked downstairs")
    assert not MemoryVector.objects.filter(memory_id=lunch.pk).exists()
    expected = SQLITE_TRIGGERS if connection.vendor == "sqlite" else PG_TRIGGERS
    assert triggers() >= expected

    # Full text: the old rows are found, and inserts and edits reach the index.
    assert texts_found(team, kin, "automobile") == {"The automobile is parked downstairs"}
    added = services.memory_add(team=team, kin=kin, content="The printer jams on Mondays", actor=ACTOR).memory
    assert texts_found(team, kin, "printer") == {"The printer jams on Mondays"}
    services.memory_update(memory=added, actor=ACTOR, content="The scanner jams on Mondays")
    assert texts_found(team, kin, "printer") == set()
    assert texts_found(team, kin, "scanner") == {"The scanner jams on Mondays"}

    # Vector generations: a warm cache sees a memory write and a vector write.
    assert set(nearest(team, kin, "automobile parked downstairs", k=1)) == {parked.pk}
    Memory.objects.filter(pk=lunch.pk).update(embedding_model=MODEL)
    assert lunch.pk not in nearest(team, kin, "lunch served noon", k=50)  # no vector yet
    MemoryVector.objects.create(memory_id=lunch.pk, vector=vector("lunch served noon"))
    assert set(nearest(team, kin, "lunch served noon", k=1)) == {lunch.pk}
    Memory.objects.filter(pk=parked.pk).update(status=Memory.Status.DELETED)
    assert parked.pk not in nearest(team, kin, "automobile parked downstairs", k=50)

    # And back: the vectors return to the column.
    try:
        migrate(BEFORE)
        assert "embedding" in memory_columns()
        OldMemory = old_models().get_model("memories", "Memory")
        assert bytes(OldMemory.objects.get(pk=lunch.pk).embedding) == vector("lunch served noon")
        assert bytes(OldMemory.objects.get(pk=parked.pk).embedding) == vector("automobile parked downstairs")
        assert OldMemory.objects.get(pk=added.pk).embedding is None
    finally:
        migrate_to_newest()
    assert bytes(MemoryVector.objects.get(memory_id=lunch.pk).vector) == vector("lunch served noon")
