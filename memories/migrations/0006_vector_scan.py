"""Vector search over every memory of a scope (memories.search.vectors): a generation per
scope (MemoryVectorScope) and a row's vector_seq, both kept by triggers, so every write
path (services, bulk_create, QuerySet.update, the admin, raw SQL) tells the vector caches
of every process what changed.

Insert, and an update that changes a memory's embedding, embedding_model, status, kin or
team (or writes a vector_seq of its own, e.g. a stale instance's save): the row's scope
generation is bumped in the same transaction, and the row's vector_seq set to it. A row
leaving its scope (kin or team changed, or deleted from the table) also changes the old
scope's epoch: its caches reload. On PostgreSQL the bump is an upsert that holds the
scope row's lock until commit, so writers of one scope commit in generation order and a
reader that sees generation G sees every row stamped up to G; a transaction bumps a
scope once (its rows share the generation), and the epoch it sets is its own number.
SQLite has one writer: there the bump is per row and the epoch a counter.

The column is added by SQL on SQLite: Django's AddField of a NOT NULL column rebuilds the
table there, which would drop the full-text triggers of 0002."""
from django.db import migrations, models

SCOPE = "memories_memoryvectorscope"

PG_FORWARD = [
    "ALTER TABLE memories_memory ADD COLUMN vector_seq bigint NOT NULL DEFAULT 0",
    f"""
    CREATE FUNCTION memories_memory_vector_seq() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        stamped bigint;
        bumped boolean;
        this_transaction bigint := pg_current_xact_id()::text::bigint;
    BEGIN
        IF TG_OP <> 'INSERT' AND (TG_OP = 'DELETE' OR OLD.team_id <> NEW.team_id
                                  OR OLD.kin_id IS DISTINCT FROM NEW.kin_id) THEN
            -- The old scope's epoch becomes this transaction's number (once: no new row
            -- version per deleted row when a kin or a team is deleted).
            INSERT INTO {SCOPE} (team_id, kin_key, generation, epoch)
            VALUES (OLD.team_id, coalesce(OLD.kin_id, 0), 0, this_transaction)
            ON CONFLICT (team_id, kin_key) DO UPDATE SET epoch = this_transaction
            WHERE {SCOPE}.epoch <> this_transaction;
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        IF TG_OP = 'UPDATE' AND NEW.vector_seq = OLD.vector_seq
           AND NEW.embedding IS NOT DISTINCT FROM OLD.embedding
           AND NEW.embedding_model IS NOT DISTINCT FROM OLD.embedding_model
           AND NEW.status IS NOT DISTINCT FROM OLD.status
           AND NEW.kin_id IS NOT DISTINCT FROM OLD.kin_id AND NEW.team_id = OLD.team_id THEN
            RETURN NEW;
        END IF;
        -- One bump per transaction and scope: its rows share the generation and commit
        -- together (a bulk insert writes the scope row once, not once per row).
        SELECT generation, xmin = pg_current_xact_id()::xid INTO stamped, bumped
        FROM {SCOPE} WHERE team_id = NEW.team_id AND kin_key = coalesce(NEW.kin_id, 0);
        IF NOT FOUND OR NOT bumped THEN
            INSERT INTO {SCOPE} (team_id, kin_key, generation, epoch)
            VALUES (NEW.team_id, coalesce(NEW.kin_id, 0), 1, 0)
            ON CONFLICT (team_id, kin_key) DO UPDATE SET generation = {SCOPE}.generation + 1
            RETURNING generation INTO stamped;
        END IF;
        NEW.vector_seq := stamped;
        RETURN NEW;
    END $$
    """,
    """
    CREATE TRIGGER memories_memory_vector_seq BEFORE INSERT OR UPDATE OR DELETE ON memories_memory
    FOR EACH ROW EXECUTE FUNCTION memories_memory_vector_seq()
    """,
]
PG_BACKWARD = [
    "DROP TRIGGER IF EXISTS memories_memory_vector_seq ON memories_memory",
    "DROP FUNCTION IF EXISTS memories_memory_vector_seq()",
    "ALTER TABLE memories_memory DROP COLUMN IF EXISTS vector_seq",
]

_SQLITE_CURRENT = f"(SELECT generation FROM {SCOPE} WHERE team_id = NEW.team_id AND kin_key = coalesce(NEW.kin_id, 0))"
_SQLITE_BUMP_NEW = f"""
        INSERT INTO {SCOPE} (team_id, kin_key, generation, epoch) VALUES (NEW.team_id, coalesce(NEW.kin_id, 0), 1, 0)
        ON CONFLICT (team_id, kin_key) DO UPDATE SET generation = generation + 1;
        UPDATE memories_memory SET vector_seq = {_SQLITE_CURRENT} WHERE id = NEW.id;
"""
_SQLITE_LEAVE_OLD = f"""
        INSERT INTO {SCOPE} (team_id, kin_key, generation, epoch) VALUES (OLD.team_id, coalesce(OLD.kin_id, 0), 1, 1)
        ON CONFLICT (team_id, kin_key) DO UPDATE SET generation = generation + 1, epoch = epoch + 1;
"""
SQLITE_FORWARD = [
    "ALTER TABLE memories_memory ADD COLUMN vector_seq bigint NOT NULL DEFAULT 0",
    f"CREATE TRIGGER memories_memory_vector_insert AFTER INSERT ON memories_memory BEGIN {_SQLITE_BUMP_NEW} END",
    f"""
    CREATE TRIGGER memories_memory_vector_move AFTER UPDATE OF team_id, kin_id ON memories_memory
    WHEN NEW.team_id IS NOT OLD.team_id OR NEW.kin_id IS NOT OLD.kin_id
    BEGIN {_SQLITE_LEAVE_OLD} END
    """,
    # The trigger's own stamp (vector_seq = the scope's generation) does not fire it again.
    f"""
    CREATE TRIGGER memories_memory_vector_update AFTER UPDATE ON memories_memory
    WHEN NEW.embedding IS NOT OLD.embedding OR NEW.embedding_model IS NOT OLD.embedding_model
        OR NEW.status IS NOT OLD.status OR NEW.kin_id IS NOT OLD.kin_id OR NEW.team_id IS NOT OLD.team_id
        OR (NEW.vector_seq IS NOT OLD.vector_seq AND NEW.vector_seq IS NOT {_SQLITE_CURRENT})
    BEGIN {_SQLITE_BUMP_NEW} END
    """,
    f"CREATE TRIGGER memories_memory_vector_delete AFTER DELETE ON memories_memory BEGIN {_SQLITE_LEAVE_OLD} END",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS memories_memory_vector_delete",
    "DROP TRIGGER IF EXISTS memories_memory_vector_update",
    "DROP TRIGGER IF EXISTS memories_memory_vector_move",
    "DROP TRIGGER IF EXISTS memories_memory_vector_insert",
    "ALTER TABLE memories_memory DROP COLUMN vector_seq",
]


def forward(apps, schema_editor):
    statements = PG_FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD
    for statement in statements:
        schema_editor.execute(statement)


def backward(apps, schema_editor):
    statements = PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD
    for statement in statements:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("memories", "0005_field_labels")]

    operations = [
        migrations.CreateModel(
            name="MemoryVectorScope",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("team_id", models.BigIntegerField()),
                ("kin_key", models.BigIntegerField()),
                ("generation", models.BigIntegerField(default=0)),
                ("epoch", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("team_id", "kin_key"), name="memoryvectorscope_scope"),
                ],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="memory",
                    name="vector_seq",
                    field=models.BigIntegerField(default=0, editable=False),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
        migrations.AddIndex(
            model_name="memory",
            index=models.Index(fields=["team", "kin", "vector_seq"], name="memory_vector_seq"),
        ),
    ]
