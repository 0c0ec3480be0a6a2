"""A partial index over the message timeline of each session, (session_id,
created_at, id) for messages only. History search uses it to find a hit's
previous and next message (its conversational context) and, on PostgreSQL, to
count a scope's messages for BM25 from the index alone. Same SQL on both
databases; the model does not declare it (like the full-text index of 0002)."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0002_event_fulltext")]
    operations = [
        migrations.RunSQL(
            "CREATE INDEX event_message_timeline ON sessions_app_event (session_id, created_at, id) "
            "WHERE kind = 'message'",
            "DROP INDEX IF EXISTS event_message_timeline",
        )
    ]
