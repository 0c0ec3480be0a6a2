"""Summary.seen_through_id: which events a summary read, so a message imported into
summarised time afterwards is found and folded in by the next compaction."""
from django.db import migrations, models

# Existing summaries cannot tell the events they read from ones imported into their time
# range since, so each counts as having read all of its session's events: nothing they
# cover is folded twice (an earlier such import stays out of their text, as before).
BACKFILL = """
UPDATE sessions_app_summary SET seen_through_id = (
    SELECT MAX(e.id) FROM sessions_app_event e WHERE e.session_id = sessions_app_summary.session_id
)
"""


class Migration(migrations.Migration):

    dependencies = [
        ("sessions_app", "0011_event_history_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="summary",
            name="seen_through_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
    ]
