"""Full-text index over memories, one per database (like sessions_app 0002):
PostgreSQL: a stored tsvector generated column (content A, subject B) with a GIN
index over active memories; SQLite: an external-content FTS5 table kept by triggers.
memories.selectors queries them; the model does not declare them."""
from django.db import migrations

PG_FORWARD = [
    """
    ALTER TABLE memories_memory ADD COLUMN search_tsv tsvector
    GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(content, '')), 'A')
        || setweight(to_tsvector('english', coalesce(subject, '')), 'B')
    ) STORED
    """,
    "CREATE INDEX memory_search_gin ON memories_memory USING GIN (search_tsv) WHERE status = 'active'",
]
PG_BACKWARD = [
    "DROP INDEX IF EXISTS memory_search_gin",
    "ALTER TABLE memories_memory DROP COLUMN IF EXISTS search_tsv",
]

SQLITE_FORWARD = [
    """
    CREATE VIRTUAL TABLE memories_memory_fts USING fts5(
        subject, content, content='memories_memory', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER memories_memory_fts_insert AFTER INSERT ON memories_memory BEGIN
        INSERT INTO memories_memory_fts(rowid, subject, content) VALUES (new.id, new.subject, new.content);
    END
    """,
    """
    CREATE TRIGGER memories_memory_fts_delete AFTER DELETE ON memories_memory BEGIN
        INSERT INTO memories_memory_fts(memories_memory_fts, rowid, subject, content)
        VALUES ('delete', old.id, old.subject, old.content);
    END
    """,
    """
    CREATE TRIGGER memories_memory_fts_update AFTER UPDATE OF subject, content ON memories_memory BEGIN
        INSERT INTO memories_memory_fts(memories_memory_fts, rowid, subject, content)
        VALUES ('delete', old.id, old.subject, old.content);
        INSERT INTO memories_memory_fts(rowid, subject, content) VALUES (new.id, new.subject, new.content);
    END
    """,
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS memories_memory_fts_update",
    "DROP TRIGGER IF EXISTS memories_memory_fts_delete",
    "DROP TRIGGER IF EXISTS memories_memory_fts_insert",
    "DROP TABLE IF EXISTS memories_memory_fts",
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
    dependencies = [("memories", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
