"""Per-session message counts by (role, sender, platform), kept by triggers on the
event table, so the prompt's participants and counts (SPEC §4) read a few rows
instead of every message of the session (SPEC §14: a turn's cost must not grow with
the history). The counts of existing sessions are filled in here.

PostgreSQL: statement-level triggers with transition tables for INSERT and DELETE
(a 1,000-message import updates each counter once), a row trigger for the rare UPDATE
of a message's role, sender, platform, kind or time. SQLite: row triggers. A counter
that reaches 0 is removed; on removal the newest time is read again from the
event_message_participants index (migration 0006)."""
import django.db.models.deletion
from django.db import migrations, models

PG_FORWARD = [
    """
    CREATE FUNCTION sessions_app_message_count_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO sessions_app_messagecount AS c (session_id, role, sender, platform, message_count, last_at)
        SELECT session_id, role, sender, platform, count(*), max(created_at)
        FROM added WHERE kind = 'message'
        GROUP BY session_id, role, sender, platform
        ON CONFLICT (session_id, role, sender, platform) DO UPDATE
        SET message_count = c.message_count + excluded.message_count,
            last_at = greatest(c.last_at, excluded.last_at);
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION sessions_app_message_count_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE sessions_app_messagecount AS c
        SET message_count = greatest(c.message_count - r.n, 0),
            last_at = coalesce((
                SELECT max(e.created_at) FROM sessions_app_event e
                WHERE e.session_id = c.session_id AND e.kind = 'message' AND e.role = c.role
                  AND e.sender = c.sender AND e.platform = c.platform), c.last_at)
        FROM (SELECT session_id, role, sender, platform, count(*) AS n
              FROM removed WHERE kind = 'message'
              GROUP BY session_id, role, sender, platform) r
        WHERE c.session_id = r.session_id AND c.role = r.role AND c.sender = r.sender AND c.platform = r.platform;
        DELETE FROM sessions_app_messagecount c
        WHERE c.message_count = 0 AND c.session_id IN (SELECT session_id FROM removed);
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION sessions_app_message_count_move() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.kind = 'message' THEN
            UPDATE sessions_app_messagecount AS c
            SET message_count = greatest(c.message_count - 1, 0),
                last_at = coalesce((
                    SELECT max(e.created_at) FROM sessions_app_event e
                    WHERE e.session_id = c.session_id AND e.kind = 'message' AND e.role = c.role
                      AND e.sender = c.sender AND e.platform = c.platform), c.last_at)
            WHERE c.session_id = OLD.session_id AND c.role = OLD.role AND c.sender = OLD.sender
              AND c.platform = OLD.platform;
            DELETE FROM sessions_app_messagecount c WHERE c.session_id = OLD.session_id AND c.message_count = 0;
        END IF;
        IF NEW.kind = 'message' THEN
            INSERT INTO sessions_app_messagecount AS c (session_id, role, sender, platform, message_count, last_at)
            VALUES (NEW.session_id, NEW.role, NEW.sender, NEW.platform, 1, NEW.created_at)
            ON CONFLICT (session_id, role, sender, platform) DO UPDATE
            SET message_count = c.message_count + 1, last_at = greatest(c.last_at, excluded.last_at);
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER sessions_app_event_count_insert AFTER INSERT ON sessions_app_event
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION sessions_app_message_count_add()
    """,
    """
    CREATE TRIGGER sessions_app_event_count_delete AFTER DELETE ON sessions_app_event
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION sessions_app_message_count_remove()
    """,
    """
    CREATE TRIGGER sessions_app_event_count_update AFTER UPDATE OF kind, role, sender, platform, created_at
    ON sessions_app_event FOR EACH ROW
    WHEN ((OLD.kind = 'message' OR NEW.kind = 'message')
          AND (OLD.kind, OLD.role, OLD.sender, OLD.platform, OLD.created_at)
              IS DISTINCT FROM (NEW.kind, NEW.role, NEW.sender, NEW.platform, NEW.created_at))
    EXECUTE FUNCTION sessions_app_message_count_move()
    """,
]
PG_BACKWARD = [
    "DROP TRIGGER IF EXISTS sessions_app_event_count_update ON sessions_app_event",
    "DROP TRIGGER IF EXISTS sessions_app_event_count_delete ON sessions_app_event",
    "DROP TRIGGER IF EXISTS sessions_app_event_count_insert ON sessions_app_event",
    "DROP FUNCTION IF EXISTS sessions_app_message_count_move()",
    "DROP FUNCTION IF EXISTS sessions_app_message_count_remove()",
    "DROP FUNCTION IF EXISTS sessions_app_message_count_add()",
]

# SQLite: the same rules per row. `old`/`new` stand for the removed and added message.
SQLITE_ADD = """
    INSERT INTO sessions_app_messagecount (session_id, role, sender, platform, message_count, last_at)
    SELECT new.session_id, new.role, new.sender, new.platform, 1, new.created_at WHERE new.kind = 'message'
    ON CONFLICT (session_id, role, sender, platform) DO UPDATE
    SET message_count = message_count + 1, last_at = max(last_at, excluded.last_at);
"""
SQLITE_REMOVE = """
    UPDATE sessions_app_messagecount
    SET message_count = max(message_count - 1, 0),
        last_at = coalesce((
            SELECT max(e.created_at) FROM sessions_app_event e
            WHERE e.session_id = old.session_id AND e.kind = 'message' AND e.role = old.role
              AND e.sender = old.sender AND e.platform = old.platform), last_at)
    WHERE old.kind = 'message' AND session_id = old.session_id AND role = old.role AND sender = old.sender
      AND platform = old.platform;
    DELETE FROM sessions_app_messagecount WHERE session_id = old.session_id AND message_count = 0;
"""
SQLITE_FORWARD = [
    f"CREATE TRIGGER sessions_app_event_count_insert AFTER INSERT ON sessions_app_event BEGIN {SQLITE_ADD} END",
    f"CREATE TRIGGER sessions_app_event_count_delete AFTER DELETE ON sessions_app_event BEGIN {SQLITE_REMOVE} END",
    f"""
    CREATE TRIGGER sessions_app_event_count_update AFTER UPDATE OF kind, role, sender, platform, created_at
    ON sessions_app_event
    WHEN (old.kind = 'message' OR new.kind = 'message')
         AND (old.kind IS NOT new.kind OR old.role IS NOT new.role OR old.sender IS NOT new.sender
              OR old.platform IS NOT new.platform OR old.created_at IS NOT new.created_at)
    BEGIN {SQLITE_REMOVE} {SQLITE_ADD} END
    """,
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS sessions_app_event_count_update",
    "DROP TRIGGER IF EXISTS sessions_app_event_count_delete",
    "DROP TRIGGER IF EXISTS sessions_app_event_count_insert",
]

BACKFILL = """
    INSERT INTO sessions_app_messagecount (session_id, role, sender, platform, message_count, last_at)
    SELECT session_id, role, sender, platform, count(*), max(created_at)
    FROM sessions_app_event WHERE kind = 'message'
    GROUP BY session_id, role, sender, platform
"""


def forward(apps, schema_editor):
    statements = PG_FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD
    for statement in [*statements, BACKFILL]:
        schema_editor.execute(statement)


def backward(apps, schema_editor):
    statements = PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD
    for statement in statements:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0007_session_workflow")]
    operations = [
        migrations.CreateModel(
            name="MessageCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("role", models.CharField(choices=[("user", "User"), ("assistant", "Assistant"), ("system", "System"),
                                                   ("tool", "Tool")], max_length=10)),
                ("sender", models.CharField(blank=True, max_length=200)),
                ("platform", models.CharField(choices=[("web", "Web"), ("telegram", "Telegram"),
                                                       ("discord", "Discord"), ("slack", "Slack"),
                                                       ("whatsapp", "Whatsapp"), ("api", "Api")], max_length=16)),
                ("message_count", models.PositiveIntegerField(default=0)),
                ("last_at", models.DateTimeField()),
                ("session", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                              related_name="message_counts", to="sessions_app.session")),
            ],
            options={
                "ordering": ["session", "-last_at"],
                "constraints": [models.UniqueConstraint(fields=("session", "role", "sender", "platform"),
                                                        name="message_count_unique")],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
