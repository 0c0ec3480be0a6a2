"""Fact.kin, ConsolidationRun.kin and ExperienceVersion.kin point at kinsite.Kin, the
model's new home (kinsite 0005). State only: the columns and their foreign key constraints
already reference the same table (sessions_app_kin)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("consolidation", "0002_dashboard_source_and_trigger_skipped_runs"),
        ("kinsite", "0005_kin"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="consolidationrun",
                    name="kin",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="consolidation_runs", to="kinsite.kin"),
                ),
                migrations.AlterField(
                    model_name="experienceversion",
                    name="kin",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="experience_versions", to="kinsite.kin"),
                ),
                migrations.AlterField(
                    model_name="fact",
                    name="kin",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="facts",
                                            to="kinsite.kin"),
                ),
            ],
            database_operations=[],
        ),
    ]
