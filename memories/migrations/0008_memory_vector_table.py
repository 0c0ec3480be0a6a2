"""Memory vectors move out of memories_memory into memories_memoryvector (one row per
memory that has a vector), so the memories heap stays narrow: a 384-d float32 vector is
1.5 KB, under PostgreSQL's 2 KB TOAST threshold, so it stayed inline and made the heap
every full-text search reads almost five times as large (391 MB against 82 MB at 100,000
memories). embedding_model stays on the memory: small, and indexed for the re-embedding
check.

The vector caches (memories.search.vectors) learn of changes from the memory row's
vector_seq (migration 0006). A trigger on the vector table carries every write there, by
any path, to that protocol: it sets the memory's vector_seq to -1, a value the memory's
own trigger never stamps, which that trigger treats as "vector_seq written by someone"
and answers by bumping the scope's generation and stamping the row. The memory trigger
no longer compares the dropped embedding column (PostgreSQL: the function is replaced;
SQLite: the update trigger is recreated, which SQLite's DROP COLUMN needs anyway, as it
refuses to drop a column a trigger names).

The column is dropped with SQL, not RemoveField: on SQLite Django rebuilds the table for
a RemoveField, which drops the full-text triggers of 0002 and the vector triggers of 0006
(SQLite ≥ 3.35 drops a column in place). Existing vectors are copied over by id ranges.
On PostgreSQL DROP COLUMN only hides the column: migration 0009 rewrites the table.

TRUNCATE fires no row trigger: like memories_memory's, the table is never truncated."""
import importlib

from django.db import migrations, models

# 0006's statements, which this migration changes and its reverse restores.
_vector_scan = importlib.import_module("memories.migrations.0006_vector_scan")
PG_MEMORY_FUNCTION_0006 = _vector_scan.PG_FORWARD[1]
SQLITE_MEMORY_UPDATE_TRIGGER_0006 = _vector_scan.SQLITE_FORWARD[3]
_EMBEDDING_TEST_PG = "AND NEW.embedding IS NOT DISTINCT FROM OLD.embedding\n"
_EMBEDDING_TEST_SQLITE = "NEW.embedding IS NOT OLD.embedding OR "
assert _EMBEDDING_TEST_PG in PG_MEMORY_FUNCTION_0006
assert _EMBEDDING_TEST_SQLITE in SQLITE_MEMORY_UPDATE_TRIGGER_0006

# Memory ids per INSERT ... SELECT when copying vectors between the tables.
COPY_BATCH = 5000

PG_MEMORY_FUNCTION = (PG_MEMORY_FUNCTION_0006.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
                      .replace(_EMBEDDING_TEST_PG, ""))
SQLITE_MEMORY_UPDATE_TRIGGER = SQLITE_MEMORY_UPDATE_TRIGGER_0006.replace(_EMBEDDING_TEST_SQLITE, "")

PG_VECTOR_TRIGGER = [
    """
    CREATE FUNCTION memories_memoryvector_touch() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- A row rewritten with the same values changes no vector.
        IF TG_OP = 'UPDATE' AND NEW IS NOT DISTINCT FROM OLD THEN
            RETURN NULL;
        END IF;
        IF TG_OP <> 'INSERT' THEN
            UPDATE memories_memory SET vector_seq = -1 WHERE id = OLD.memory_id;
        END IF;
        IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.memory_id <> OLD.memory_id) THEN
            UPDATE memories_memory SET vector_seq = -1 WHERE id = NEW.memory_id;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER memories_memoryvector_touch AFTER INSERT OR UPDATE OR DELETE ON memories_memoryvector
    FOR EACH ROW EXECUTE FUNCTION memories_memoryvector_touch()
    """,
]
PG_VECTOR_TRIGGER_DROP = [
    "DROP TRIGGER IF EXISTS memories_memoryvector_touch ON memories_memoryvector",
    "DROP FUNCTION IF EXISTS memories_memoryvector_touch()",
]

SQLITE_VECTOR_TRIGGERS = [
    """
    CREATE TRIGGER memories_memoryvector_insert AFTER INSERT ON memories_memoryvector
    BEGIN UPDATE memories_memory SET vector_seq = -1 WHERE id = NEW.memory_id; END
    """,
    """
    CREATE TRIGGER memories_memoryvector_update AFTER UPDATE ON memories_memoryvector
    WHEN NEW.vector IS NOT OLD.vector OR NEW.memory_id IS NOT OLD.memory_id
    BEGIN UPDATE memories_memory SET vector_seq = -1 WHERE id IN (OLD.memory_id, NEW.memory_id); END
    """,
    """
    CREATE TRIGGER memories_memoryvector_delete AFTER DELETE ON memories_memoryvector
    BEGIN UPDATE memories_memory SET vector_seq = -1 WHERE id = OLD.memory_id; END
    """,
]
SQLITE_VECTOR_TRIGGERS_DROP = [
    "DROP TRIGGER IF EXISTS memories_memoryvector_insert",
    "DROP TRIGGER IF EXISTS memories_memoryvector_update",
    "DROP TRIGGER IF EXISTS memories_memoryvector_delete",
]


def _copy_by_id_ranges(schema_editor, *, ids_sql: str, copy_sql: str) -> None:
    """Run `copy_sql` (two parameters: a half-open id range) over the ids `ids_sql` spans,
    COPY_BATCH ids at a time."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(ids_sql)
        low, high = cursor.fetchone()
    if low is None:
        return
    for start in range(low, high + 1, COPY_BATCH):
        schema_editor.execute(copy_sql, [start, start + COPY_BATCH])


def _copy_vectors_out(schema_editor) -> None:
    _copy_by_id_ranges(
        schema_editor,
        ids_sql="SELECT min(id), max(id) FROM memories_memory WHERE embedding IS NOT NULL",
        copy_sql="INSERT INTO memories_memoryvector (memory_id, vector) SELECT id, embedding FROM memories_memory"
                 " WHERE embedding IS NOT NULL AND id >= %s AND id < %s",
    )


def _copy_vectors_back(schema_editor) -> None:
    _copy_by_id_ranges(
        schema_editor,
        ids_sql="SELECT min(memory_id), max(memory_id) FROM memories_memoryvector",
        copy_sql="UPDATE memories_memory SET embedding = (SELECT v.vector FROM memories_memoryvector v"
                 " WHERE v.memory_id = memories_memory.id) WHERE id >= %s AND id < %s"
                 " AND id IN (SELECT memory_id FROM memories_memoryvector)",
    )


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # Before the vector trigger exists: copying changes no vector, so it bumps nothing.
        _copy_vectors_out(schema_editor)
        schema_editor.execute(PG_MEMORY_FUNCTION)
        schema_editor.execute("ALTER TABLE memories_memory DROP COLUMN embedding")
        for statement in PG_VECTOR_TRIGGER:
            schema_editor.execute(statement)
        return
    _copy_vectors_out(schema_editor)
    schema_editor.execute("DROP TRIGGER memories_memory_vector_update")
    schema_editor.execute(SQLITE_MEMORY_UPDATE_TRIGGER)
    schema_editor.execute("ALTER TABLE memories_memory DROP COLUMN embedding")
    for statement in SQLITE_VECTOR_TRIGGERS:
        schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_VECTOR_TRIGGER_DROP:
            schema_editor.execute(statement)
        schema_editor.execute("ALTER TABLE memories_memory ADD COLUMN embedding bytea NULL")
        _copy_vectors_back(schema_editor)
        schema_editor.execute(PG_MEMORY_FUNCTION_0006.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
        return
    for statement in SQLITE_VECTOR_TRIGGERS_DROP:
        schema_editor.execute(statement)
    schema_editor.execute("ALTER TABLE memories_memory ADD COLUMN embedding BLOB NULL")
    _copy_vectors_back(schema_editor)
    schema_editor.execute("DROP TRIGGER memories_memory_vector_update")
    schema_editor.execute(SQLITE_MEMORY_UPDATE_TRIGGER_0006)


class Migration(migrations.Migration):
    dependencies = [("memories", "0007_embedding_runs")]

    operations = [
        migrations.CreateModel(
            name="MemoryVector",
            fields=[
                ("memory", models.OneToOneField(on_delete=models.deletion.CASCADE, primary_key=True,
                                                related_name="vector", serialize=False, to="memories.memory")),
                ("vector", models.BinaryField()),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.RemoveField(model_name="memory", name="embedding")],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
