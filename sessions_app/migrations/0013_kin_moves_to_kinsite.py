"""Kin has moved to kinsite (kinsite 0005): Session.kin points there and the model leaves
this app's state. State only for the schema: the table keeps its name (sessions_app_kin),
its rows and every foreign key constraint, and no DDL runs.

The content type (sessions_app, kin) becomes (kinsite, kin), so the kin permissions
(add_kin, change_kin, delete_kin, view_kin: codenames unchanged) given to users and groups
now read kinsite.change_kin etc., as the admin asks, and admin log entries link to the
kin's new admin page. Idempotent: nothing to move on a fresh database (post_migrate creates
the content types after the run) or one already moved. If post_migrate has already created
(kinsite, kin) — `migrate kinsite` run alone stops between the two halves of the move — the
old content type is folded into it: its permissions' grants go to the twin permissions, its
log entries to the new content type, and it is deleted. Reversible the same way."""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODEL = "kin"


def _move_content_type(apps, schema_editor, *, old: str, new: str) -> None:
    db = schema_editor.connection.alias
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    LogEntry = apps.get_model("admin", "LogEntry")
    content_types = ContentType.objects.using(db)
    moving = content_types.filter(app_label=old, model=MODEL).first()
    if moving is None:
        return
    target = content_types.filter(app_label=new, model=MODEL).first()
    if target is None:
        moving.app_label = new
        moving.save(update_fields=["app_label"])
        return
    # Both exist: fold the old content type into the new one.
    grants = [
        (apps.get_model("auth", "Group").permissions.through, "group_id"),
        (apps.get_model(settings.AUTH_USER_MODEL).user_permissions.through, "user_id"),
    ]
    for permission in Permission.objects.using(db).filter(content_type=moving):
        twin = Permission.objects.using(db).filter(content_type=target, codename=permission.codename).first()
        if twin is None:
            permission.content_type = target
            permission.save(update_fields=["content_type"])
            continue
        for through, holder in grants:
            rows = through.objects.using(db).filter(permission_id=permission.pk)
            holders_of_twin = through.objects.using(db).filter(permission_id=twin.pk).values(holder)
            rows.filter(**{f"{holder}__in": holders_of_twin}).delete()
            rows.update(permission_id=twin.pk)
        permission.delete()
    LogEntry.objects.using(db).filter(content_type=moving).update(content_type=target)
    moving.delete()


def content_type_to_kinsite(apps, schema_editor):
    _move_content_type(apps, schema_editor, old="sessions_app", new="kinsite")


def content_type_to_sessions_app(apps, schema_editor):
    _move_content_type(apps, schema_editor, old="kinsite", new="sessions_app")


class Migration(migrations.Migration):

    dependencies = [
        ("sessions_app", "0012_summary_seen_through"),
        # Every foreign key to the model is repointed before the old model leaves the state.
        ("kinsite", "0005_kin"),
        ("memories", "0004_kin_moves_to_kinsite"),
        ("consolidation", "0003_kin_moves_to_kinsite"),
        # The content type move reads these tables.
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("admin", "0003_logentry_add_action_flag_choices"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="session",
                    name="kin",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="sessions",
                                            to="kinsite.kin"),
                ),
                migrations.DeleteModel(name="Kin"),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_to_kinsite, content_type_to_sessions_app),
    ]
