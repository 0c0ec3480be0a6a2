"""PostgreSQL only: memory search's GIN index also holds the scope, so a query reads
the posting lists of one kin (or of one team's shared memories) instead of the whole
table's and intersecting them with the kin afterwards, which was most of a search's
time at 100,000 memories. Two partial indexes because GIN cannot search for NULL: the
kin's memories by (kin_id, search_tsv), the team-shared ones by (team_id, search_tsv);
memories.selectors writes its scope so the planner can OR the two.

Indexing an integer column in GIN needs the btree_gin extension (contrib, trusted, so
the database owner may create it). Where it is missing the old table-wide index stays.

fastupdate is off on these indexes: with it, new entries wait in an unsorted pending
list that every search scans in full until the next vacuum; memories are searched on
every turn and written far less often, so the write pays instead (PostgreSQL docs,
"GIN Fast Update Technique")."""
from django.db import migrations

SCOPE_INDEXES = [
    "CREATE INDEX IF NOT EXISTS memory_search_kin_gin ON memories_memory USING GIN (kin_id, search_tsv) "
    "WITH (fastupdate = off) WHERE status = 'active' AND kin_id IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS memory_search_shared_gin ON memories_memory USING GIN (team_id, search_tsv) "
    "WITH (fastupdate = off) WHERE status = 'active' AND kin_id IS NULL",
]
OLD_INDEX = ("CREATE INDEX IF NOT EXISTS memory_search_gin ON memories_memory USING GIN (search_tsv) "
             "WHERE status = 'active'")


def _btree_gin_available(cursor) -> bool:
    cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin'")
    return cursor.fetchone() is not None


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if not _btree_gin_available(cursor):
            # Keep the table-wide index, but without the pending list (see the module doc).
            schema_editor.execute("ALTER INDEX memory_search_gin SET (fastupdate = off)")
            schema_editor.execute("SELECT gin_clean_pending_list('memory_search_gin')")
            return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    for statement in SCOPE_INDEXES:
        schema_editor.execute(statement)
    schema_editor.execute("DROP INDEX IF EXISTS memory_search_gin")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(OLD_INDEX)
    schema_editor.execute("DROP INDEX IF EXISTS memory_search_kin_gin")
    schema_editor.execute("DROP INDEX IF EXISTS memory_search_shared_gin")
    # The extension stays: other objects may have come to use it.


class Migration(migrations.Migration):
    dependencies = [("memories", "0002_memory_fulltext")]
    operations = [migrations.RunPython(forward, backward)]
