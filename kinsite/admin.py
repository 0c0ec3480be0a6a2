"""Admin for users, teams, memberships, API tokens, the LLM call log (read-only) and prompt
templates. Every admin here and in the apps is team-scoped (kinsite.admin_mixins)."""
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from kinsite.admin_mixins import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    role_rank,
    scoped,
    user_manageable_by,
)
from kinsite.errors import InvalidInput
from kinsite.models import ApiToken, Kin, LLMCall, Membership, PromptTemplate, Team
from kinsite.prompt_template_kinds import KINDS, template_default, template_placeholders
from kinsite.prompt_templates import (
    prompt_template_set_active,
    template_preview,
    template_previewer,
    template_validate,
)
from kinsite.selectors import team_for_user
from kinsite.services import api_token_issue, api_token_revoke


def membership_change_refusal(membership: Membership, editor, *, role: str | None = None,
                              team_id: int | None = None) -> str:
    """Why `editor` may not give `membership` the `role` in `team_id` (both defaulting to the
    stored ones), or "": staff who are not superusers grant no role above their own in that
    team, and change or remove no membership above it (as in user_manageable_by)."""
    if editor.is_superuser:
        return ""
    if membership.pk:
        stored = Membership.objects.get(pk=membership.pk)
        if Membership.Role(stored.role).rank > role_rank(editor, stored.team_id):
            return f"Only a superuser or a team's {stored.role} may change this {stored.role}'s membership."
    team_id = team_id if team_id is not None else membership.team_id
    role = role or membership.role
    if role and team_id and Membership.Role(role).rank > role_rank(editor, team_id):
        return f"You may not give a role above your own in this team ({role})."
    return ""


class RankedMembershipForm(forms.ModelForm):
    """The membership form of the admin and of the team page's inline, which check the editor's
    rank (membership_change_refusal); `editor` is set per request by the admin."""

    editor = None

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk and not self.has_changed():
            return cleaned  # the owner's row, left as it is, on the team page an admin saves
        team = cleaned.get("team") or getattr(self.instance, "team", None)
        refusal = membership_change_refusal(self.instance, self.editor, role=cleaned.get("role"),
                                            team_id=team.pk if team else None)
        if refusal:
            raise forms.ValidationError(refusal)
        return cleaned


class RankedMembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        for form in self.deleted_forms:  # a deleted row's own form is not validated
            refusal = form.instance.pk and membership_change_refusal(form.instance, form.editor)
            if refusal:
                raise forms.ValidationError(refusal)


class RankedMembershipAdminMixin:
    form = RankedMembershipForm

    def _ranked(self, form_class, request):
        return type(form_class.__name__, (form_class,), {"editor": request.user})

    def has_change_permission(self, request, obj=None):
        if isinstance(obj, Membership) and membership_change_refusal(obj, request.user):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if isinstance(obj, Membership) and membership_change_refusal(obj, request.user):
            return False
        return super().has_delete_permission(request, obj)


class MembershipInline(RankedMembershipAdminMixin, TeamScopedAdminMixin, admin.TabularInline):
    model = Membership
    formset = RankedMembershipFormSet
    extra = 0
    autocomplete_fields = ["user"]

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = self._ranked(formset.form, request)
        return formset


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


# Installation-wide powers that only superusers see or grant: superuser status and permissions
# reach past every team, and staff status is worthless without permissions, so it stays with
# whoever grants those.
SUPERUSER_ONLY_USER_FIELDS = ("is_superuser", "groups", "user_permissions")
SUPERUSER_ONLY_READONLY_USER_FIELDS = ("is_staff",)


@admin.register(get_user_model())
class TeamScopedUserAdmin(TeamScopedAdminMixin, UserAdmin):
    """Staff who are not superusers manage only the accounts user_manageable_by allows: taking
    over another would step out of their scope. Enforced on the object, not only by hiding fields."""

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


admin.site.unregister(Group)


@admin.register(Group)
class SuperuserOnlyGroupAdmin(GroupAdmin):
    """Groups are permission sets of the whole installation, so only superusers see or change
    them: a team admin editing one would grant its permissions in every team."""

    def has_module_permission(self, request):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


@admin.register(Membership)
class MembershipAdmin(RankedMembershipAdminMixin, TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        return self._ranked(super().get_form(request, obj, change=change, **kwargs), request)


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
            "team": "Empty: the chosen kin's team.",
            "kin": "Empty: the team's template, used by every kin of the team without its own.",
            "body": "Placeholders are names in braces, e.g. {kin_name}; the ones each kind allows are listed "
                    "below. Write {{ and }} for literal braces; in a consolidation template any brace that is "
                    "not a placeholder (a JSON example) is literal as it is.",
            "is_active": "Only active templates are used; at most one per kind for a kin, and one for the team.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "team" in self.fields:
            self.fields["team"].required = False  # taken from the kin when left empty (clean)
        if "kin" in self.fields:
            self.fields["kin"].queryset = self.fields["kin"].queryset.select_related("team")
            if self.instance.pk:
                self.fields["kin"].queryset = self.fields["kin"].queryset.filter(team_id=self.instance.team_id)

    def clean(self):
        cleaned = super().clean()
        team, kin, kind, body = (cleaned.get(name) for name in ("team", "kin", "kind", "body"))
        if team is None and "team" not in self.errors:
            if kin is not None:
                team = cleaned["team"] = kin.team  # a kin's template belongs to the kin's team
            elif "kin" not in self.errors:
                self.add_error("team", "Choose a team, or a kin to take the team from.")
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


class PromptPreviewForm(forms.Form):
    """A preview of the change form's template text, saved or not, with a kin's real data: kind
    and body validated as a save would, a kin of the user's teams and, if the kind reads one,
    a session of it."""

    kind = PromptTemplate._meta.get_field("kind").formfield()
    body = PromptTemplate._meta.get_field("body").formfield()
    preview_kin = KinChoiceField(
        queryset=Kin.objects.none(), label="Kin",
        error_messages={"required": "Choose a kin to preview with.",
                        "invalid_choice": "Choose one of the kins offered (a kin of your teams)."},
    )
    preview_session = forms.IntegerField(required=False, min_value=1, label="Session")

    def __init__(self, *args, kins, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["preview_kin"].queryset = kins

    def clean(self):
        cleaned = super().clean()
        kind, body = cleaned.get("kind"), cleaned.get("body")
        if kind and body is not None:
            # The save's own check, so the preview refuses exactly what a save refuses.
            for error in template_validate(kind, body):
                self.add_error("body", error)
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
                     "“Preview with a kin's real data”, below, renders the text in the form, saved or not."}),
        (None, {"fields": ["created_at", "updated_at"]}),
    ]
    actions = ["activate", "deactivate"]

    def has_delete_permission(self, request, obj=None):
        return False

    # --- the preview with a kin's real data (templates/admin/kinsite/prompttemplate/) ---

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("preview/", view(self.preview_view), name="kinsite_prompttemplate_preview_add"),
            path("preview/sessions/", view(self.preview_sessions_view), name="kinsite_prompttemplate_preview_sessions"),
            path("<path:object_id>/preview/", view(self.preview_view), name="kinsite_prompttemplate_preview"),
            *super().get_urls(),
        ]

    @staticmethod
    def _url(view: str, obj: PromptTemplate | None = None) -> str:
        return reverse(f"admin:kinsite_prompttemplate_{view}", args=[obj.pk] if obj is not None else [])

    def _preview_kins(self, request):
        return scoped(Kin.objects.select_related("team"), request.user)

    def _may_preview(self, request, obj=None) -> bool:
        # Whoever may save the form may preview it: change permission on this template, or
        # add permission on the add page.
        return self.has_change_permission(request, obj) if obj is not None else self.has_add_permission(request)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None and not obj.pk:
            obj = None
        if self._may_preview(request, obj):
            kin = self._preview_kins(request).filter(pk=obj.kin_id).first() if obj and obj.kin_id else None
            context["real_data_preview"] = {
                "url": self._url("preview", obj) if obj else self._url("preview_add"),
                "sessions_url": self._url("preview_sessions"),
                "kins": self._preview_kins(request),
                "kin_id": kin.pk if kin else None,
                "sessions": self._sessions(obj.kind, kin) if kin else [],
                "reads_session": obj is None or template_previewer(obj.kind).sessions is not None,
            }
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    @staticmethod
    def _sessions(kind: str | None, kin: Kin | None) -> list[tuple[int, str]]:
        if kin is None or kind not in KINDS:
            return []
        lister = template_previewer(kind).sessions
        return lister(kin) if lister else []

    def preview_view(self, request, object_id=None):
        """The change form posted here (htmx, or the Preview button without JavaScript), rendered
        as its job would send it for the chosen kin. Writes nothing, calls no model."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = None
        if object_id is not None:
            obj = self.get_object(request, unquote(object_id))
            if obj is None:
                raise Http404("No such prompt template.")
        if not self._may_preview(request, obj):
            raise PermissionDenied
        form = PromptPreviewForm(request.POST, kins=self._preview_kins(request))
        preview, error = None, ""
        if form.is_valid():
            data = form.cleaned_data
            try:
                preview = template_previewer(data["kind"]).render(
                    body=data["body"], kin=data["preview_kin"], session_id=data["preview_session"]
                )
            except InvalidInput as exc:  # a session not of the kin, no session, nothing to summarise
                error = exc.message
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "original": obj, "form": form,
            "preview": preview, "error": error, "kin": form.cleaned_data.get("preview_kin") if preview else None,
            "title": "Template preview", "back_url": self._url("change", obj) if obj else self._url("add"),
        }
        if request.htmx:
            # 200 either way: htmx swaps in only successful responses, errors included.
            return TemplateResponse(request, "admin/kinsite/prompttemplate/_preview.html", context)
        return TemplateResponse(request, "admin/kinsite/prompttemplate/preview.html", context,
                                status=200 if preview else 400)

    def preview_sessions_view(self, request):
        """The session choices of the preview (htmx, when the kin or the kind changes): the
        chosen kin's sessions, if it is a kin of the user's teams and the kind reads one."""
        if not (self.has_add_permission(request) or self.has_change_permission(request)):
            raise PermissionDenied
        try:
            kin = self._preview_kins(request).filter(pk=int(request.GET.get("preview_kin", ""))).first()
        except ValueError:  # no kin chosen, or not a number
            kin = None
        kind = request.GET.get("kind")
        reads_session = kind in KINDS and template_previewer(kind).sessions is not None
        return TemplateResponse(request, "admin/kinsite/prompttemplate/_preview_sessions.html",
                                {"sessions": self._sessions(kind, kin), "reads_session": reads_session})

    def get_changeform_initial_data(self, request):
        # ?kind=consolidation starts the body from that kind's built-in default.
        initial = super().get_changeform_initial_data(request)
        if "team" not in initial:
            # The user's team, as the dashboard picks it; none for a superuser in no team.
            team = team_for_user(user=request.user)
            if team is not None:
                initial["team"] = team.pk
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
