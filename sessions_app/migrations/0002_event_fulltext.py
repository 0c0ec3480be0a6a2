"""Full-text index over message events, one per database:
PostgreSQL: a stored tsvector generated column with a partial GIN index;
SQLite: an external-content FTS5 table kept current by triggers.
The model does not declare these; sessions_app.selectors.history_search queries them."""
from django.db import migrations

PG_FORWARD = [
    """
    ALTER TABLE sessions_app_event ADD COLUMN search_tsv tsvector
    GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(content, '')), 'A')
        || setweight(to_tsvector('english', coalesce(sender, '')), 'B')
    ) STORED
    """,
    "CREATE INDEX event_search_gin ON sessions_app_event USING GIN (search_tsv) WHERE kind = 'message'",
]
PG_BACKWARD = [
    "DROP INDEX IF EXISTS event_search_gin",
    "ALTER TABLE sessions_app_event DROP COLUMN IF EXISTS search_tsv",
]

SQLITE_FORWARD = [
    """
    CREATE VIRTUAL TABLE sessions_app_event_fts USING fts5(
        sender, content, content='sessions_app_event', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER sessions_app_event_fts_insert AFTER INSERT ON sessions_app_event
    WHEN new.kind = 'message' BEGIN
        INSERT INTO sessions_app_event_fts(rowid, sender, content) VALUES (new.id, new.sender, new.content);
    END
    """,
    """
    CREATE TRIGGER sessions_app_event_fts_delete AFTER DELETE ON sessions_app_event
    WHEN old.kind = 'message' BEGIN
        INSERT INTO sessions_app_event_fts(sessions_app_event_fts, rowid, sender, content)
        VALUES ('delete', old.id, old.sender, old.content);
    END
    """,
    """
    CREATE TRIGGER sessions_app_event_fts_update AFTER UPDATE OF sender, content, kind ON sessions_app_event
    BEGIN
        INSERT INTO sessions_app_event_fts(sessions_app_event_fts, rowid, sender, content)
        SELECT 'delete', old.id, old.sender, old.content WHERE old.kind = 'message';
        INSERT INTO sessions_app_event_fts(rowid, sender, content)
        SELECT new.id, new.sender, new.content WHERE new.kind = 'message';
    END
    """,
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS sessions_app_event_fts_update",
    "DROP TRIGGER IF EXISTS sessions_app_event_fts_delete",
    "DROP TRIGGER IF EXISTS sessions_app_event_fts_insert",
    "DROP TABLE IF EXISTS sessions_app_event_fts",
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
    dependencies = [("sessions_app", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
