"""PostgreSQL only: rewrite memories_memory once without the vectors 0008 moved out.
DROP COLUMN only hides a column; every row keeps its 1.5 KB vector until the row is
written again, and memories are rarely rewritten, so the heap full-text search reads
would stay as large as before. VACUUM FULL writes a compact copy (holding an exclusive
lock on the table meanwhile: seconds at 100,000 memories). It cannot run in a
transaction, hence a migration of its own, not atomic; running it again is harmless."""
from django.db import migrations


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("VACUUM FULL memories_memory")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memories", "0008_memory_vector_table")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
