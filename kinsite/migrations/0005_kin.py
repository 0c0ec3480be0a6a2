"""Kin moves here from sessions_app (issue 15), beside Team, so every app may depend on it.

State only: the table keeps its name (sessions_app_kin) and its rows, and no SQL runs. The
model is created in this app's state, then every foreign key to it is repointed in its own
app's state (here LLMCall.kin and PromptTemplate.kin; memories 0004, consolidation 0003,
sessions_app 0013), and last sessions_app 0013 removes the old model from its state and
moves the content type, so permissions and admin log entries follow."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("kinsite", "0004_prompt_template"),
        # The table was created, and last changed, by sessions_app's migrations.
        ("sessions_app", "0012_summary_seen_through"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Kin",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("name", models.CharField(max_length=100)),
                        ("role", models.CharField(blank=True, max_length=200)),
                        ("character", models.TextField(blank=True)),
                        ("expertise", models.TextField(blank=True)),
                        ("model", models.CharField(blank=True, max_length=200)),
                        ("history_token_budget", models.PositiveIntegerField(blank=True, null=True)),
                        ("spawn_reason", models.TextField(blank=True)),
                        ("overrides", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        ("parent", models.ForeignKey(blank=True, null=True,
                                                     on_delete=django.db.models.deletion.SET_NULL,
                                                     related_name="children", to="kinsite.kin")),
                        ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                                   related_name="kins", to="kinsite.team")),
                    ],
                    options={
                        "db_table": "sessions_app_kin",
                        "ordering": ["id"],
                    },
                ),
                migrations.AlterField(
                    model_name="llmcall",
                    name="kin",
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                            related_name="+", to="kinsite.kin"),
                ),
                migrations.AlterField(
                    model_name="prompttemplate",
                    name="kin",
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="prompt_templates", to="kinsite.kin"),
                ),
            ],
            database_operations=[],
        ),
    ]
