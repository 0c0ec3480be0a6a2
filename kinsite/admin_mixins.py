"""Admin helpers shared by the apps: team scoping for staff who are not superusers, and
read-only audit tables."""
import functools

from django.contrib import admin
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.widgets import ForeignKeyRawIdWidget
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q


@functools.cache
def team_path(model) -> str | None:
    """The lookup from `model` to the team that owns its rows ("kin__team" for a fact), the
    shortest chain of foreign keys; None for models no team owns. Derived, not declared, so a
    new model is scoped the moment its admin uses the mixin below."""
    from kinsite.models import Team

    if model is Team:
        return "pk"
    paths, seen = [(model, "")], {model}
    while paths:
        following = []
        for current, path in paths:
            for field in current._meta.concrete_fields:
                target = field.related_model if field.many_to_one or field.one_to_one else None
                if target is None or target in seen:
                    continue
                lookup = f"{path}__{field.name}" if path else field.name
                if target is Team:
                    return lookup
                seen.add(target)
                following.append((target, lookup))
        paths = following
    return None


def _team_ids(user):
    from kinsite.models import Membership

    return Membership.objects.filter(user=user).values("team_id")


def scope_q(model, user) -> Q | None:
    """What of `model` the user may see in the admin: everything for a superuser, else the
    rows of the user's teams (None: no restriction)."""
    if user.is_superuser:
        return None
    if model is get_user_model():
        # Members of the user's teams, and people in no team yet (so a team admin can find a
        # newly created colleague to add), never superusers; and themselves.
        return (Q(memberships__team__in=_team_ids(user)) | Q(memberships__isnull=True, is_superuser=False)
                | Q(pk=user.pk))
    path = team_path(model)
    if path is None:
        return Q(pk__in=[])  # owned by no team: superusers only
    return Q(**{f"{path}__in": _team_ids(user)})


def role_rank(user, team_id) -> int:
    """`user`'s rank in the team (kinsite.models.Membership.Role.rank); -1 when not a member."""
    from kinsite.models import Membership

    role = Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()
    return Membership.Role(role).rank if role else -1


def user_manageable_by(target, editor) -> bool:
    """Whether `editor` may change, re-password or delete the account `target` in the admin: a
    superuser any; anyone else themselves, or a non-superuser in no team the editor is not in,
    outranking the editor in none, and holding no permission the editor lacks (even while
    inactive: the editor may reactivate them)."""
    if editor.is_superuser or target.pk == editor.pk:
        return True
    if target.is_superuser:
        return False
    from django.contrib.auth.models import Permission

    from kinsite.models import Membership

    if Membership.objects.filter(user=target).exclude(team_id__in=_team_ids(editor)).exists():
        return False
    editor_ranks = {m.team_id: Membership.Role(m.role).rank for m in Membership.objects.filter(user=editor)}
    if any(Membership.Role(m.role).rank > editor_ranks[m.team_id] for m in Membership.objects.filter(user=target)):
        return False
    held = Permission.objects.filter(Q(user=target) | Q(group__user=target)).values_list(
        "content_type__app_label", "codename")
    return {f"{app}.{codename}" for app, codename in held} <= editor.get_all_permissions()


def scoped(queryset, user):
    q = scope_q(queryset.model, user)
    if q is None:
        return queryset
    if queryset.model is get_user_model():
        # The membership join repeats a user once per shared team.
        return queryset.filter(pk__in=queryset.model._default_manager.filter(q).values("pk"))
    return queryset.filter(q)


class TeamScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A list filter on a relation offering only the related rows the user may see (the
    plain one lists every team's names)."""

    def field_choices(self, field, request, model_admin):
        ordering = self.field_admin_ordering(field, request, model_admin)
        return field.get_choices(include_blank=False, ordering=ordering,
                                 limit_choices_to=scope_q(field.related_model, request.user))


class ScopedRawIdWidget(ForeignKeyRawIdWidget):
    """A raw-id box labels the id it holds with the object's name, read from the whole table:
    posted back with another team's id, it would name that team's object. Only ids of the
    field's (scoped) choices get a label."""

    def __init__(self, *args, choices, **kwargs):
        super().__init__(*args, **kwargs)
        self.scoped_choices = choices

    def label_and_url_for_value(self, value):
        key = self.rel.get_related_field().name
        try:
            visible = self.scoped_choices.filter(**{key: value}).exists()
        except (ValueError, TypeError, DjangoValidationError):
            visible = False
        return super().label_and_url_for_value(value) if visible else ("", "")


class TeamScopedAdminMixin:
    """Staff who are not superusers see, open and choose only their teams' rows:
    the list and every object page (another team's id answers like a missing one), the
    choices of every foreign key (team, kin, session...), list filters and autocompletes.
    For ModelAdmins and inlines alike."""

    def get_queryset(self, request):
        return scoped(super().get_queryset(request), request.user)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if "queryset" not in kwargs:
            queryset = self.get_field_queryset(None, db_field, request)
            if queryset is None:
                queryset = db_field.remote_field.model._default_manager.all()
            kwargs["queryset"] = scoped(queryset, request.user)
        formfield = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if formfield is not None and type(formfield.widget) is ForeignKeyRawIdWidget:
            widget = formfield.widget
            formfield.widget = ScopedRawIdWidget(widget.rel, widget.admin_site, attrs=widget.attrs,
                                                 using=widget.db, choices=formfield.queryset)
        return formfield

    def get_list_filter(self, request):
        filters = []
        for entry in super().get_list_filter(request):
            if isinstance(entry, str) and get_fields_from_path(self.model, entry)[-1].is_relation:
                entry = (entry, TeamScopedRelatedFilter)
            filters.append(entry)
        return filters


class ReadOnlyAdminMixin:
    """For audit tables: admins read them, nobody edits or deletes them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
