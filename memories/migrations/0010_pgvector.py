"""PostgreSQL with pgvector (memories.vectorindex): create the extension where the database
allows it (in a savepoint: a database without pgvector, or a role without the right, just
stays in the exact mode), and only then give memories_memoryvector its pgvector column,
generated from the float32 bytes of `vector`. A RunPython that decides at run time, so the
migration graph is the same on every database; SQLite and PostgreSQL without pgvector do
nothing. Adding the column computes it for every existing vector (about 0.5 ms each).

No HNSW index here: building one takes minutes on a large table. `manage.py vector_index
--build` or beat's task builds it once the current model's vectors exist."""
from django.db import migrations


def forward(apps, schema_editor):
    from memories.vectorindex import pgvector_enable

    pgvector_enable(schema_editor)


def backward(apps, schema_editor):
    from memories.vectorindex import pgvector_disable

    pgvector_disable(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("memories", "0009_memory_heap_rewrite")]

    operations = [migrations.RunPython(forward, backward)]
