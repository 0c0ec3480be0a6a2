from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0014_compaction_run"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="archived_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
