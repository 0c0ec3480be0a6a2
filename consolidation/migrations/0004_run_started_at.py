from django.db import migrations, models
from django.db.models import F


def running_runs_started_when_created(apps, schema_editor):
    # The stalled sweep (kinsite.jobs) reads started_at; a run left running before it existed
    # began about when it was created.
    ConsolidationRun = apps.get_model("consolidation", "ConsolidationRun")
    ConsolidationRun.objects.filter(status="running", started_at__isnull=True).update(started_at=F("created_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('consolidation', '0003_kin_moves_to_kinsite'),
    ]

    operations = [
        migrations.AddField(
            model_name='consolidationrun',
            name='started_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(running_runs_started_when_created, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='consolidationrun',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['id'], name='consolidation_run_pending'),
        ),
        migrations.AddIndex(
            model_name='consolidationrun',
            index=models.Index(condition=models.Q(('status', 'running')), fields=['started_at'], name='consolidation_run_running'),
        ),
    ]
