"""Memory.kin points at kinsite.Kin, the model's new home (kinsite 0005). State only: the
column and its foreign key constraint already reference the same table (sessions_app_kin)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("kinsite", "0005_kin"),
        ("memories", "0003_memory_search_scope_gin"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="memory",
                    name="kin",
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="memories", to="kinsite.kin"),
                ),
            ],
            database_operations=[],
        ),
    ]
