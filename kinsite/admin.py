"""Admin for users, teams, memberships, API tokens, the LLM call log (read-only) and prompt
templates. Every admin here and in the apps is team-scoped (kinsite.admin_mixins)."""
from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.utils.html import format_html, format_html_join

from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin, user_manageable_by
from kinsite.models import ApiToken, LLMCall, Membership, PromptTemplate, Team
from kinsite.prompt_templates import (
    KINDS,
    prompt_template_set_active,
    template_default,
    template_placeholders,
    template_preview,
    template_validate,
)
from kinsite.services import api_token_issue, api_token_revoke


class MembershipInline(TeamScopedAdminMixin, admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "slug", "timezone", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    def has_add_permission(self, request):
        # A new team has no members, so a staff user who is not a superuser would lose sight of it.
        return request.user.is_superuser and super().has_add_permission(request)


# Django's own User admin, scoped: staff who are not superusers see their teams' members
# (and people in no team yet), not every team's.
admin.site.unregister(get_user_model())


# Installation-wide powers a staff user who is not a superuser may neither see nor grant:
# superuser status and permissions (directly or through groups) reach past every team, and
# staff status is worth nothing without permissions, so granting it stays with whoever
# grants those (a superuser) rather than leaving half-made staff users behind.
SUPERUSER_ONLY_USER_FIELDS = ("is_superuser", "groups", "user_permissions")
SUPERUSER_ONLY_READONLY_USER_FIELDS = ("is_staff",)


@admin.register(get_user_model())
class TeamScopedUserAdmin(TeamScopedAdminMixin, UserAdmin):
    """Staff who are not superusers manage their teams' people (names, emails, passwords,
    active) but never a superuser, never someone who also belongs to a team of theirs they
    are not in, and never someone holding a permission they lack: taking over such an account
    (by password or email) would step out of their own scope. Enforced on the object
    (change, password, delete), not only by hiding fields."""

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if request.user.is_superuser:
            return fieldsets
        # Left out of the form altogether, so a posted value is ignored, not just not shown.
        return [
            (name, {**options, "fields": [f for f in options["fields"] if f not in SUPERUSER_ONLY_USER_FIELDS]})
            for name, options in fieldsets
        ]

    def get_readonly_fields(self, request, obj=None):
        readonly = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser and obj is not None:
            readonly += [f for f in SUPERUSER_ONLY_READONLY_USER_FIELDS if f not in readonly]
        return readonly

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and (obj is None or user_manageable_by(obj, request.user))

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or user_manageable_by(obj, request.user))


@admin.register(Membership)
class MembershipAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    """Tokens are issued here (the raw value is shown once, in a message) and revoked
    with an action; the digest itself is never editable."""

    list_display = ["name", "prefix", "team", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["team"]
    search_fields = ["name", "prefix"]
    fields = ["team", "user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_change_permission(self, request, obj=None):
        return obj is None  # the add form only; an issued token is not edited

    def save_model(self, request, obj, form, change):
        token, raw = api_token_issue(team=obj.team, name=obj.name, user=obj.user)
        obj.pk = token.pk
        obj.prefix = token.prefix
        messages.warning(request, f"New token (shown once, copy it now): {raw}")

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)
        messages.success(request, f"Revoked {queryset.count()} token(s).")


@admin.register(LLMCall)
class LLMCallAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "created_at", "team", "kin", "purpose", "provider", "model", "tokens_in", "tokens_out", "latency_ms",
        "attempts", "status",
    ]
    list_filter = ["status", "purpose", "provider"]
    search_fields = ["model", "error"]
    date_hierarchy = "created_at"


class KinChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return f"{obj.name} ({obj.team})"  # kins of different teams may share a name


class PromptTemplateForm(forms.ModelForm):
    class Meta:
        model = PromptTemplate
        fields = ["team", "kin", "kind", "name", "body", "is_active"]
        field_classes = {"kin": KinChoiceField}
        widgets = {"body": forms.Textarea(attrs={"rows": 30, "cols": 110, "style": "font-family: monospace"})}
        help_texts = {
            "kin": "Empty: the team's template, used by every kin of the team without its own.",
            "body": "Placeholders are names in braces, e.g. {kin_name}; the ones each kind allows are listed "
                    "below. Write {{ and }} for literal braces; in a consolidation template any brace that is "
                    "not a placeholder (a JSON example) is literal as it is.",
            "is_active": "Only active templates are used; at most one per kind for a kin, and one for the team.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "kin" in self.fields:
            self.fields["kin"].queryset = self.fields["kin"].queryset.select_related("team")
            if self.instance.pk:
                self.fields["kin"].queryset = self.fields["kin"].queryset.filter(team_id=self.instance.team_id)

    def clean(self):
        cleaned = super().clean()
        team, kin, kind, body = (cleaned.get(name) for name in ("team", "kin", "kind", "body"))
        if kind and body is not None:
            for error in template_validate(kind, body):
                self.add_error("body", error)
        if team and kin and kin.team_id != team.pk:
            self.add_error("kin", f"{kin.name} belongs to team {kin.team}, not to {team}.")
        elif team and kind and cleaned.get("is_active") and "kin" not in self.errors:
            active = PromptTemplate.objects.filter(team=team, kin=kin, kind=kind, is_active=True)
            if self.instance.pk:
                active = active.exclude(pk=self.instance.pk)
            other = active.first()
            if other is not None:
                scope = f"kin {kin.name}" if kin else f"team {team}"
                # On is_active, so the model's own (less readable) constraint check is skipped.
                self.add_error(
                    "is_active",
                    f"“{other.name}” is already the active {kind} template of {scope}. Save this one "
                    "inactive and use the “Activate” action, or deactivate the other first.",
                )
        return cleaned


@admin.register(PromptTemplate)
class PromptTemplateAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    """Templates are edited, previewed and (de)activated here; they are not deleted, because
    audit rows (consolidation runs) name the template they used: deactivate instead."""

    form = PromptTemplateForm
    list_display = ["name", "kind", "team", "kin", "is_active", "updated_at"]
    list_filter = ["kind", "is_active", "team"]
    search_fields = ["name", "body"]
    list_select_related = ["team", "kin"]
    readonly_fields = ["placeholders", "preview", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["team", "kin", "kind", "name", "is_active"]}),
        ("Template", {"fields": ["body", "placeholders"]}),
        ("Preview", {"fields": ["preview"], "description": "The saved template rendered with sample values. "
                     "“Save and continue editing” to preview changes."}),
        (None, {"fields": ["created_at", "updated_at"]}),
    ]
    actions = ["activate", "deactivate"]

    def has_delete_permission(self, request, obj=None):
        return False

    def get_changeform_initial_data(self, request):
        # ?kind=consolidation starts the body from that kind's built-in default.
        initial = super().get_changeform_initial_data(request)
        if initial.get("kind") in KINDS and "body" not in initial:
            initial["body"] = template_default(initial["kind"])
        return initial

    @admin.display(description="Allowed placeholders")
    def placeholders(self, obj):
        kinds = [obj.kind] if obj and obj.kind in KINDS else list(KINDS)
        return format_html_join(
            "",
            "<p><strong>{}</strong>: {}</p>",
            (
                (kind, format_html_join(", ", "<code>{{{}}}</code> ({})", template_placeholders(kind).items()))
                for kind in kinds
            ),
        )

    @admin.display(description="Rendered with sample values")
    def preview(self, obj):
        if obj is None or not obj.pk:
            return "Save the template to see it rendered with sample values."
        errors = template_validate(obj.kind, obj.body)
        if errors:
            return format_html_join("", '<p class="errornote">{}</p>', ((error,) for error in errors))
        # format_html escapes the text: templates and sample values are shown, never interpreted.
        return format_html(
            '<pre class="prompt-preview" style="white-space: pre-wrap; max-width: 60em">{}</pre>',
            template_preview(obj.kind, obj.body),
        )

    @admin.action(description="Activate selected templates (replacing the active one of the same scope)")
    def activate(self, request, queryset):
        for template in queryset.order_by("updated_at"):
            prompt_template_set_active(template=template, active=True)
        # Of several selected in one scope the most recently edited wins, so count what is active now.
        messages.success(request, f"{queryset.filter(is_active=True).count()} of the selected template(s) now active.")

    @admin.action(description="Deactivate selected templates")
    def deactivate(self, request, queryset):
        for template in queryset:
            prompt_template_set_active(template=template, active=False)
        messages.success(request, f"Deactivated {queryset.count()} template(s).")
