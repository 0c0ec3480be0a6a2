import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sessions_app', '0013_kin_moves_to_kinsite'),
    ]

    operations = [
        migrations.CreateModel(
            name='CompactionRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('done', 'Done'), ('failed', 'Failed')], default='pending', max_length=10)),
                ('attempts', models.PositiveSmallIntegerField(default=0)),
                ('error', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='compaction_runs', to='sessions_app.session')),
                ('summary', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='sessions_app.summary')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
                'indexes': [models.Index(condition=models.Q(('status', 'pending')), fields=['id'], name='compaction_run_pending'), models.Index(condition=models.Q(('status', 'running')), fields=['started_at'], name='compaction_run_running')],
            },
        ),
    ]
