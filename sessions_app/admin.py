"""Admin for kins, sessions and the event store (events are read-only: history is never rewritten)."""
from django.contrib import admin

from kinsite.admin_mixins import ReadOnlyAdminMixin
from sessions_app.models import Event, Kin, Session, Summary, Turn


@admin.register(Kin)
class KinAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "role", "model", "parent", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "role"]
    raw_id_fields = ["parent"]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "kin", "last_activity_at", "created_at"]
    list_filter = ["kin__team"]
    search_fields = ["title", "description"]
    raw_id_fields = ["kin"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "kind", "role", "sender", "platform", "external_id", "token_count", "created_at"]
    list_filter = ["kind", "role", "platform"]
    search_fields = ["content", "sender", "external_id"]
    list_select_related = ["session"]
    show_full_result_count = False


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "status", "is_async", "tool_calls", "prompt_tokens", "tokens_in", "tokens_out", "created_at", "finished_at"]
    list_filter = ["status", "is_async"]
    search_fields = ["error"]
    list_select_related = ["session"]


@admin.register(Summary)
class SummaryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "session", "message_count", "first_at", "last_at", "token_count", "created_at"]
    search_fields = ["content"]
    list_select_related = ["session"]
