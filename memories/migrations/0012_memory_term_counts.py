"""Full-text statistics per memory scope (MemoryTermCount), kept by triggers on
PostgreSQL, so memory search reads its query's document frequencies and the scope's
size instead of counting them over the scope (every minute per scope, 30 ms at 19,000
memories and 150 ms at 109,000: bench/README.md, "Memory search at 1,000,000 memories").
The counts of existing memories are filled in here.

Only active memories count. INSERT and DELETE: statement triggers with transition tables
(an import or a bulk load updates each counter once). UPDATE: a row trigger, only when
the status, scope or text changed: search marks its hits retrieved with an UPDATE of
other columns, which must not pay for it (and column lists exclude transition tables).
Every statement writes its counters sorted by (team, kin, lexeme), so the scope's row
(lexeme '', sorted first, written by every statement that touches the scope, even when
its figures do not change) is locked before any lexeme's: the writers of one scope wait
for each other there, one transaction at a time, and cannot deadlock on the lexemes. The generated tsvector
(migration 0002) is set before AFTER triggers, so they read it. SQLite keeps no counts:
its search (FTS5 bm25()) has its own statistics."""
from django.db import migrations, models

TABLE = "memories_memorytermcount"

# The counters of a set of memory rows (team_id, kin_id, search_tsv) given as `rows`,
# signed by `sign`: one per scope and lexeme, plus lexeme '' for the scope's size.
_COUNTERS = """
    SELECT team_id, coalesce(kin_id, 0) AS kin_key, '' AS lexeme, {sign} * count(*) AS documents,
           {sign} * sum(length(search_tsv)) AS total_length
    FROM {rows} WHERE status = 'active' GROUP BY 1, 2
    UNION ALL
    SELECT team_id, coalesce(kin_id, 0), lexeme, {sign} * count(*), 0
    FROM {rows}, unnest(tsvector_to_array(search_tsv)) AS lexeme WHERE status = 'active' GROUP BY 1, 2, 3
"""
_ADD = f"""
    INSERT INTO {TABLE} AS c (team_id, kin_key, lexeme, documents, total_length)
    SELECT * FROM ({{counters}}) AS counters ORDER BY 1, 2, 3
    ON CONFLICT (team_id, kin_key, lexeme) DO UPDATE
    SET documents = c.documents + excluded.documents, total_length = c.total_length + excluded.total_length
"""
# The counters of those rows that fell to 0 (only theirs: a scope has thousands).
_DROP_ZEROS = f"""
    DELETE FROM {TABLE} c
    USING (SELECT DISTINCT team_id, coalesce(kin_id, 0) AS kin_key, lexeme
           FROM {{rows}}, unnest(array[''] || tsvector_to_array(search_tsv)) AS lexeme) AS s
    WHERE c.team_id = s.team_id AND c.kin_key = s.kin_key AND c.lexeme = s.lexeme AND c.documents <= 0
"""

PG_FORWARD = [
    f"""
    CREATE FUNCTION memories_term_counts_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_ADD.format(counters=_COUNTERS.format(sign=1, rows="added"))};
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION memories_term_counts_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_ADD.format(counters=_COUNTERS.format(sign=-1, rows="removed"))};
        {_DROP_ZEROS.format(rows="removed")};
        RETURN NULL;
    END $$
    """,
    # The old row's counters out, the new row's in, as one signed set (sorted, one lock order).
    f"""
    CREATE FUNCTION memories_term_counts_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {_ADD.format(counters=(
            "SELECT team_id, kin_key, lexeme, sum(documents), sum(total_length) FROM ("
            + _COUNTERS.format(sign=-1, rows="(SELECT OLD.team_id, OLD.kin_id, OLD.status, OLD.search_tsv) AS o")
            + " UNION ALL "
            + _COUNTERS.format(sign=1, rows="(SELECT NEW.team_id, NEW.kin_id, NEW.status, NEW.search_tsv) AS n")
            + ") AS signed GROUP BY 1, 2, 3"
            + " HAVING sum(documents) <> 0 OR sum(total_length) <> 0 OR lexeme = ''"))};
        {_DROP_ZEROS.format(rows="(SELECT OLD.team_id, OLD.kin_id, OLD.search_tsv) AS o")};
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER memories_memory_term_counts_insert AFTER INSERT ON memories_memory
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION memories_term_counts_add()
    """,
    """
    CREATE TRIGGER memories_memory_term_counts_delete AFTER DELETE ON memories_memory
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION memories_term_counts_remove()
    """,
    """
    CREATE TRIGGER memories_memory_term_counts_update AFTER UPDATE OF status, team_id, kin_id, content, subject
    ON memories_memory FOR EACH ROW
    WHEN ((OLD.status = 'active' OR NEW.status = 'active')
          AND (OLD.status, OLD.team_id, OLD.kin_id, OLD.search_tsv)
              IS DISTINCT FROM (NEW.status, NEW.team_id, NEW.kin_id, NEW.search_tsv))
    EXECUTE FUNCTION memories_term_counts_change()
    """,
    f"{_ADD.format(counters=_COUNTERS.format(sign=1, rows='memories_memory'))}",
]
PG_BACKWARD = [
    "DROP TRIGGER IF EXISTS memories_memory_term_counts_update ON memories_memory",
    "DROP TRIGGER IF EXISTS memories_memory_term_counts_delete ON memories_memory",
    "DROP TRIGGER IF EXISTS memories_memory_term_counts_insert ON memories_memory",
    "DROP FUNCTION IF EXISTS memories_term_counts_change()",
    "DROP FUNCTION IF EXISTS memories_term_counts_remove()",
    "DROP FUNCTION IF EXISTS memories_term_counts_add()",
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0011_source_mcp"),
    ]

    operations = [
        migrations.CreateModel(
            name="MemoryTermCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("team_id", models.BigIntegerField()),
                ("kin_key", models.BigIntegerField()),
                ("lexeme", models.TextField()),
                ("documents", models.BigIntegerField(default=0)),
                ("total_length", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("team_id", "kin_key", "lexeme"), name="memorytermcount_scope_lexeme"),
                ],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
