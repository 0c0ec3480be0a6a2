"""Every memory's source_ref in the one writer format of kinsite.actors ("<kind>:<value>").
Two writers used another shape: the API stored the bare token prefix ("ks_ab12cd"), now
"token:ks_ab12cd", and the demo data "create_demo", now "command:create_demo". One UPDATE
each; the rows' updated_at is left as it was (nothing the memory says changed)."""
from django.db import migrations
from django.db.models import F, Value
from django.db.models.functions import Concat, Substr


def forwards(apps, schema_editor):
    Memory = apps.get_model("memories", "Memory")
    (Memory.objects.filter(source="api").exclude(source_ref="").exclude(source_ref__contains=":")
     .update(source_ref=Concat(Value("token:"), F("source_ref"))))
    Memory.objects.filter(source_ref="create_demo").update(source_ref="command:create_demo")


def backwards(apps, schema_editor):
    Memory = apps.get_model("memories", "Memory")
    # "token:" is 6 characters; Substr counts from 1.
    Memory.objects.filter(source="api", source_ref__startswith="token:").update(source_ref=Substr("source_ref", 7))
    Memory.objects.filter(source_ref="command:create_demo").update(source_ref="create_demo")


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0012_memory_term_counts"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
