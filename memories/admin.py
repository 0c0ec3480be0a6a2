"""Admin for memories and their change log. Edits save through memories.services.memory_update
(so each writes a change row) and "Mark deleted" calls memory_delete; admin neither adds
memories (kins, the API and the dashboard do) nor hard-deletes one, which would erase its history."""
from django.conf import settings
from django.contrib import admin, messages
from django.db.models.functions import Length
from django.utils.text import Truncator

from kinsite.actors import user_ref
from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin
from memories import services
from memories.embeddings import embedding_model_current
from memories.models import EmbeddingRun, Memory, MemoryChange, MemoryTermCount, MemoryVector, MemoryVectorScope


def _actor(request) -> services.Actor:
    return services.Actor(label=user_ref(request.user), user=request.user)


class MemoryChangeInline(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.TabularInline):
    model = MemoryChange
    extra = 0
    fields = ["created_at", "action", "actor", "reason", "before", "after"]
    readonly_fields = fields
    ordering = ["created_at", "id"]


@admin.register(Memory)
class MemoryAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    # Fits a 1280 px window beside the navigation and filters: long text is cut short, and
    # the kin is a plain (cut) text column, as Django renders foreign key columns unwrapped.
    # The rest is on the memory's page (change_list.html breaks long words anywhere).
    list_display = ["id", "short_content", "kin_name", "short_subject", "status", "updated_at"]
    list_filter = ["status", "category", "source", "embedding_model", "team"]
    search_fields = ["content", "subject", "source_ref"]
    list_select_related = ["kin"]
    fields = [
        "team",
        "kin",
        *services.EDITABLE_FIELDS,
        "status",
        "source",
        "source_ref",
        "superseded_by",
        "embedding_model",
        "retrieval_count",
        "last_retrieved_at",
        "created_at",
        "updated_at",
    ]
    readonly_fields = [name for name in fields if name not in services.EDITABLE_FIELDS]
    inlines = [MemoryChangeInline]
    actions = ["mark_deleted"]
    show_full_result_count = False

    def changelist_view(self, request, extra_context=None):
        # Which model makes new vectors, above the list (its filter shows what the rows have).
        extra_context = {**(extra_context or {}), "embeddings": settings.EMBEDDINGS,
                         "embedding_model": embedding_model_current()}
        return super().changelist_view(request, extra_context=extra_context)

    @admin.display(description="content")
    def short_content(self, memory):
        return Truncator(memory.content).chars(80)

    @admin.display(description="kin", ordering="kin__name")
    def kin_name(self, memory):
        return Truncator(memory.kin.name).chars(30) if memory.kin else "— (shared)"

    @admin.display(description="subject", ordering="subject")
    def short_subject(self, memory):
        return Truncator(memory.subject).chars(40)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        changed = {name: form.cleaned_data[name] for name in form.changed_data if name in services.EDITABLE_FIELDS}
        if changed:
            services.memory_update(memory=obj, actor=_actor(request), reason="Edited in admin.", **changed)

    @admin.action(description="Mark selected memories deleted (history stays)")
    def mark_deleted(self, request, queryset):
        count = 0
        for memory in queryset.exclude(status=Memory.Status.DELETED):
            services.memory_delete(memory=memory, actor=_actor(request), reason="Deleted in admin.")
            count += 1
        messages.success(request, f"Marked {count} memor{'y' if count == 1 else 'ies'} deleted.")


@admin.register(MemoryChange)
class MemoryChangeAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "memory", "action", "actor", "created_at"]
    list_filter = ["action"]
    search_fields = ["actor", "reason"]
    raw_id_fields = ["memory"]
    list_select_related = ["memory"]
    show_full_result_count = False


@admin.register(EmbeddingRun)
class EmbeddingRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Re-embedding runs (memories.reembed), read-only: the beat check starts them and
    `manage.py reembed_memories` shows or starts one. No team owns them: superusers only."""

    list_display = ["id", "model", "status", "progress", "attempts", "created_at", "started_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["model"]
    fields = ["model", "status", "progress", "total", "done", "cursor", "attempts", "error", "created_at",
              "started_at", "finished_at"]
    readonly_fields = fields
    show_full_result_count = False

    @admin.display(description="progress")
    def progress(self, run):
        percent = 100 if not run.total else min(100, round(100 * run.done / run.total))
        return f"{min(run.done, run.total)} of {run.total} ({percent}%)"


@admin.register(MemoryVector)
class MemoryVectorAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Which memories have a vector, of which model and size, read-only (memory_vector_set
    writes them). The vectors themselves are never read here: kilobytes of numbers a row."""

    list_display = ["memory_id", "memory", "embedding_model", "dimensions"]
    fields = ["memory", "embedding_model", "dimensions"]
    readonly_fields = fields
    list_select_related = ["memory"]
    search_fields = ["=memory__id"]
    show_full_result_count = False

    def get_queryset(self, request):
        return super().get_queryset(request).defer("vector").annotate(vector_bytes=Length("vector"))

    @admin.display(description="model")
    def embedding_model(self, row):
        return row.memory.embedding_model

    @admin.display(description="dimensions")
    def dimensions(self, row):
        return row.vector_bytes // 4


@admin.register(MemoryVectorScope)
class MemoryVectorScopeAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The vector generation of each memory scope (memories.search.vectors' cache check),
    read-only: database triggers keep it. Plain ids, no team relation: superusers only."""

    list_display = ["id", "team", "kin", "generation", "epoch"]
    search_fields = ["=team_id", "=kin_key"]
    fields = list_display
    readonly_fields = fields
    show_full_result_count = False

    @admin.display(description="team ID", ordering="team_id")
    def team(self, scope):
        return scope.team_id

    @admin.display(description="kin ID", ordering="kin_key")
    def kin(self, scope):
        return scope.kin_key or "— (shared memories)"


@admin.register(MemoryTermCount)
class MemoryTermCountAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Full-text counters of each memory scope (memories.search.postgres's BM25
    statistics), read-only: database triggers keep them (PostgreSQL). Plain ids, no team
    relation: superusers only."""

    list_display = ["id", "team", "kin", "lexeme", "documents", "total_length"]
    search_fields = ["=team_id", "=kin_key", "=lexeme"]
    fields = list_display
    readonly_fields = fields
    show_full_result_count = False

    @admin.display(description="team ID", ordering="team_id")
    def team(self, row):
        return row.team_id

    @admin.display(description="kin ID", ordering="kin_key")
    def kin(self, row):
        return row.kin_key or "— (shared memories)"
