"""Admin for kins, sessions and the event store (events are read-only: history is never rewritten)."""
from django import forms
from django.contrib import admin, messages

from consolidation.models import ConsolidationRun
from consolidation.services import ConsolidationBusy, NothingToConsolidate, consolidation_run
from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin
from kinsite.models import Kin
from sessions_app.introspection.services import IntrospectionDisabled, introspection_request
from sessions_app.models import CompactionRun, Event, IntrospectionRun, MessageCount, Session, Summary, Turn
from sessions_app.overrides import HISTORY_TOKEN_BUDGET_RANGE, overrides_errors


class KinAdminForm(forms.ModelForm):
    """The same bounds as the API (sessions_app.overrides)."""

    history_token_budget = forms.IntegerField(
        required=False, min_value=HISTORY_TOKEN_BUDGET_RANGE.low, max_value=HISTORY_TOKEN_BUDGET_RANGE.high,
        help_text="Tokens of history in a prompt; empty: HISTORY_TOKEN_BUDGET.",
    )

    class Meta:
        model = Kin
        fields = "__all__"  # noqa: DJ007 - KinAdmin's fieldsets choose the fields; the form adds the checks

    def clean_overrides(self):
        overrides = self.cleaned_data.get("overrides")
        if overrides is None:
            return {}  # an emptied box: no overrides (the column is not nullable)
        errors = overrides_errors(overrides, stored=self.instance.overrides if self.instance.pk else None)
        if errors:
            raise forms.ValidationError(errors)
        return overrides


@admin.register(Kin)
class KinAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    form = KinAdminForm
    list_display = ["name", "team", "role", "model", "parent", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "role"]
    raw_id_fields = ["parent"]
    actions = ["consolidate_now"]

    @admin.action(description="Consolidate now")
    def consolidate_now(self, request, queryset):
        # Synchronous, like the API: each kin's run finishes before the page comes back.
        for kin in queryset.select_related("team"):
            try:
                run = consolidation_run(kin=kin, trigger=ConsolidationRun.Trigger.ADMIN)
            except ConsolidationBusy:
                self.message_user(request, f"{kin.name}: another consolidation is running.", messages.WARNING)
                continue
            except NothingToConsolidate as exc:
                self.message_user(request, exc.message, messages.INFO)
                continue
            level = messages.SUCCESS if run.status == ConsolidationRun.Status.APPLIED else messages.WARNING
            outcome = f"run {run.pk} {run.status}"
            if run.experience_version_id:
                outcome += f", experience version {run.experience_version.version}"
            if run.error:
                outcome += f": {run.error}"
            self.message_user(request, f"{kin.name}: {outcome}.", level)


class MessageCountInline(TeamScopedAdminMixin, admin.TabularInline):
    """The session's message counts per participant, as the database keeps them
    (triggers, migration 0008): shown, never edited."""

    model = MessageCount
    fields = ["role", "sender", "platform", "message_count", "last_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ArchivedFilter(admin.SimpleListFilter):
    title = "archived"
    parameter_name = "archived"

    def lookups(self, request, model_admin):
        return [("yes", "Archived"), ("no", "Not archived")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(archived_at__isnull=self.value() == "no")
        return queryset


@admin.register(Session)
class SessionAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["id", "title", "kin", "last_activity_at", "introspection_pending", "archived_at", "created_at"]
    list_filter = ["kin__team", ArchivedFilter]
    search_fields = ["title", "description"]
    raw_id_fields = ["kin"]
    inlines = [MessageCountInline]
    actions = ["introspect_now"]

    @admin.action(description="Introspect now")
    def introspect_now(self, request, queryset):
        queued, disabled = [], []
        for session in queryset.select_related("kin"):
            try:
                queued.append(introspection_request(session=session, trigger=IntrospectionRun.Trigger.MANUAL).pk)
            except IntrospectionDisabled:
                disabled.append(session.pk)
        if queued:
            self.message_user(request, f"Introspection requested: run(s) {', '.join(map(str, queued))}.",
                              messages.SUCCESS)
        if disabled:
            self.message_user(request, "Introspection is disabled for the kin of session(s) "
                              f"{', '.join(map(str, disabled))}.", messages.WARNING)


@admin.register(Event)
class EventAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "kind", "role", "sender", "platform", "external_id", "token_count", "created_at"]
    list_filter = ["kind", "role", "platform"]
    search_fields = ["content", "sender", "external_id"]
    list_select_related = ["session"]
    show_full_result_count = False


@admin.register(MessageCount)
class MessageCountAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["session", "role", "sender", "platform", "message_count", "last_at"]
    list_filter = ["role", "platform"]
    search_fields = ["sender"]
    list_select_related = ["session"]


@admin.register(Turn)
class TurnAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "status", "is_async", "attempts", "auto_retries", "tool_calls", "prompt_tokens",
                    "tokens_in", "tokens_out", "created_at", "finished_at"]
    list_filter = ["status", "is_async"]
    search_fields = ["error", "retry_reason"]
    list_select_related = ["session"]


@admin.register(Summary)
class SummaryAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "message_count", "first_at", "last_at", "token_count", "created_at"]
    search_fields = ["content"]
    list_select_related = ["session"]


@admin.register(CompactionRun)
class CompactionRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "status", "attempts", "summary", "created_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["error"]
    list_select_related = ["session", "summary"]


@admin.register(IntrospectionRun)
class IntrospectionRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "trigger", "status", "event_count", "tokens_in", "tokens_out", "duration_ms",
                    "created_at"]
    list_filter = ["status", "trigger"]
    search_fields = ["summary", "error"]
    list_select_related = ["session"]
