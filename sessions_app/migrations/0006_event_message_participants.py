"""A covering partial index over each session's messages by (role, sender, platform),
with created_at and id: the prompt's per-participant message counts (SPEC §4,
sessions_app.context._message_counts) are then read from the index alone, already
grouped, instead of from every message row of the session. Same SQL on both
databases; the model does not declare it (like event_message_timeline of 0003)."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0005_introspection")]
    operations = [
        migrations.RunSQL(
            "CREATE INDEX event_message_participants ON sessions_app_event "
            "(session_id, role, sender, platform, created_at, id) WHERE kind = 'message'",
            "DROP INDEX IF EXISTS event_message_participants",
        )
    ]
