"""Admin for teams, memberships, API tokens and the LLM call log (read-only)."""
from django.contrib import admin, messages

from kinsite.admin_mixins import ReadOnlyAdminMixin
from kinsite.models import ApiToken, LLMCall, Membership, Team
from kinsite.services import api_token_issue, api_token_revoke


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "timezone", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
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
class LLMCallAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "team", "kin", "purpose", "provider", "model", "tokens_in", "tokens_out", "latency_ms", "attempts", "status"]
    list_filter = ["status", "purpose", "provider"]
    search_fields = ["model", "error"]
    date_hierarchy = "created_at"
