"""History search postings (PostgreSQL only): one row per (message, lexeme) of the
stored search_tsv (migration 0002), with the term's frequency, the message's length and
a precomputed BM25 term impact, so that a search reads at most a fixed number of the
best postings per query term from a btree index, whatever the history length (issue 19;
sessions_app.selectors._search_postgresql). The rows of existing messages are filled in
here.

Kept by triggers on the event table, so every way a message is written, edited or
removed (a turn, an import, an edit, a cascade from a session or kin) is covered:
a statement-level trigger with a transition table for INSERT and DELETE (a 1,000-message
import inserts its postings in one statement), a row trigger for the rare UPDATE of a
message's content, sender, kind or session, and TRUNCATE. Writing messages only INSERTs
and DELETEs the postings of those messages: there is no per-session
counter row that two concurrent writers would both update (an earlier design kept term
and length counters and serialised concurrent imports into one session). The scope's
statistics (message count, average length, document frequencies) are read at query
time instead.

The stored impact must not depend on anything that changes as the scope grows, so its
length normalisation uses a fixed typical message length (POSTING_AVG_LENGTH), not the
scope's average; the search uses it only to pick candidates and scores them exactly
from tf and doc_length. SQLite keeps its FTS5 table (migration 0002): nothing here."""
from django.db import migrations

# BM25 k1 and b as in sessions_app.selectors, and a typical message length in lexemes
# with the sender's name (LoCoMo's turns average 14.5, bench/history_growth.py's 17).
POSTING_K1 = 1.2
POSTING_B = 0.75
POSTING_AVG_LENGTH = 14.0

# The postings of the messages of `source` (a relation with the event table's columns),
# for an INSERT ... SELECT. A sender match counts half a content match (SENDER_WEIGHT):
# content lexemes are weighted A, sender lexemes B (migration 0002).
POSTING_ROWS = f"""
    SELECT m.id, m.session_id, s.kin_id, v.lexeme, t.tf, length(m.search_tsv),
           (t.tf * {POSTING_K1 + 1} / (t.tf + {POSTING_K1} * (1 - {POSTING_B}
                + {POSTING_B} * length(m.search_tsv) / {POSTING_AVG_LENGTH})))::real
    FROM {{source}} m
    JOIN sessions_app_session s ON s.id = m.session_id
    CROSS JOIN LATERAL unnest(m.search_tsv) v
    CROSS JOIN LATERAL (
        SELECT (cardinality(v.weights) - 0.5 * cardinality(array_positions(v.weights, 'B')))::real AS tf
    ) t
    WHERE m.kind = 'message'
"""
INSERT_POSTINGS = (
    "INSERT INTO sessions_app_searchposting (event_id, session_id, kin_id, lexeme, tf, doc_length, impact)"
    + POSTING_ROWS
)

FORWARD = [
    """
    CREATE TABLE sessions_app_searchposting (
        event_id bigint NOT NULL,
        session_id bigint NOT NULL,
        kin_id bigint NOT NULL,
        lexeme text NOT NULL,
        tf real NOT NULL,
        doc_length integer NOT NULL,
        impact real NOT NULL,
        -- Exact rescoring reads (tf, doc_length) of a few hundred messages by id, index only.
        PRIMARY KEY (event_id, lexeme) INCLUDE (tf, doc_length)
    )
    """,
    f"""
    CREATE FUNCTION sessions_app_searchposting_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {INSERT_POSTINGS.format(source="added")};
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION sessions_app_searchposting_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM sessions_app_searchposting p USING removed r WHERE p.event_id = r.id AND r.kind = 'message';
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION sessions_app_searchposting_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM sessions_app_searchposting WHERE event_id = OLD.id;
        {INSERT_POSTINGS.format(source="(SELECT NEW.*)")};
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION sessions_app_searchposting_clear() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        TRUNCATE sessions_app_searchposting;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION sessions_app_searchposting_move_session() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE sessions_app_searchposting SET kin_id = NEW.kin_id WHERE session_id = NEW.id;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER sessions_app_event_posting_insert AFTER INSERT ON sessions_app_event
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION sessions_app_searchposting_add()
    """,
    """
    CREATE TRIGGER sessions_app_event_posting_delete AFTER DELETE ON sessions_app_event
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION sessions_app_searchposting_remove()
    """,
    # search_tsv is generated from content and sender, so these columns cover every change of it.
    """
    CREATE TRIGGER sessions_app_event_posting_update AFTER UPDATE OF content, sender, kind, session_id
    ON sessions_app_event FOR EACH ROW
    WHEN ((OLD.kind = 'message' OR NEW.kind = 'message')
          AND (OLD.search_tsv, OLD.kind, OLD.session_id) IS DISTINCT FROM (NEW.search_tsv, NEW.kind, NEW.session_id))
    EXECUTE FUNCTION sessions_app_searchposting_change()
    """,
    # Django's flush (TransactionTestCase) truncates the event table; the postings go with it.
    """
    CREATE TRIGGER sessions_app_event_posting_truncate AFTER TRUNCATE ON sessions_app_event
    FOR EACH STATEMENT EXECUTE FUNCTION sessions_app_searchposting_clear()
    """,
    # Sessions do not change kin today; if one ever does, its postings follow it.
    """
    CREATE TRIGGER sessions_app_session_posting_kin AFTER UPDATE OF kin_id ON sessions_app_session
    FOR EACH ROW WHEN (OLD.kin_id IS DISTINCT FROM NEW.kin_id)
    EXECUTE FUNCTION sessions_app_searchposting_move_session()
    """,
    # The triggers exist before the backfill, and creating them locks the event table against
    # writes until this migration commits, so no message is missed or indexed twice.
    INSERT_POSTINGS.format(source="sessions_app_event"),
    # A search reads the best postings of a lexeme in its scope (a session, or all a kin's
    # sessions), highest impact first, and scores them: index only.
    """
    CREATE INDEX searchposting_session_best ON sessions_app_searchposting (session_id, lexeme, impact DESC)
    INCLUDE (event_id, tf, doc_length)
    """,
    """
    CREATE INDEX searchposting_kin_best ON sessions_app_searchposting (kin_id, lexeme, impact DESC)
    INCLUDE (event_id, tf, doc_length)
    """,
    "ANALYZE sessions_app_searchposting",
]
BACKWARD = [
    "DROP TRIGGER IF EXISTS sessions_app_session_posting_kin ON sessions_app_session",
    "DROP TRIGGER IF EXISTS sessions_app_event_posting_truncate ON sessions_app_event",
    "DROP TRIGGER IF EXISTS sessions_app_event_posting_update ON sessions_app_event",
    "DROP TRIGGER IF EXISTS sessions_app_event_posting_delete ON sessions_app_event",
    "DROP TRIGGER IF EXISTS sessions_app_event_posting_insert ON sessions_app_event",
    "DROP FUNCTION IF EXISTS sessions_app_searchposting_move_session()",
    "DROP FUNCTION IF EXISTS sessions_app_searchposting_clear()",
    "DROP FUNCTION IF EXISTS sessions_app_searchposting_change()",
    "DROP FUNCTION IF EXISTS sessions_app_searchposting_remove()",
    "DROP FUNCTION IF EXISTS sessions_app_searchposting_add()",
    "DROP TABLE IF EXISTS sessions_app_searchposting",
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0017_field_labels")]
    operations = [migrations.RunPython(forward, backward)]
