"""Admin for the fact ledger, consolidation runs and experience versions.

Runs and versions are audit rows: read-only. The fact ledger is append-only: staff may
add a fact (it goes through consolidation.services.fact_record with source "admin", like
any other writer) but never change or delete one; consolidation supersedes facts."""
from django.contrib import admin

from consolidation import services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.actors import user_ref
from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin

FACT_ADD_FIELDS = ["kin", "statement", "category"]


@admin.register(Fact)
class FactAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "category", "short_statement", "source", "status", "is_consolidated", "created_at"]
    list_filter = ["status", "is_consolidated", "category", "source"]
    search_fields = ["statement", "source_ref"]
    list_select_related = ["kin"]
    raw_id_fields = ["kin"]
    show_full_result_count = False

    @admin.display(description="statement")
    def short_statement(self, fact):
        return fact.statement[:100]

    def get_fields(self, request, obj=None):
        if obj is None:
            return FACT_ADD_FIELDS
        return [field.name for field in Fact._meta.concrete_fields if field.name != "id"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        fact = services.fact_record(
            kin=form.cleaned_data["kin"],
            statement=form.cleaned_data["statement"],
            category=form.cleaned_data["category"],
            source=Fact.Source.ADMIN,
            source_ref=user_ref(request.user),
        )
        # The admin logs the addition and links to `obj`: make it the recorded row.
        for field in Fact._meta.concrete_fields:
            setattr(obj, field.attname, getattr(fact, field.attname))
        obj._state.adding = False
        obj._state.db = fact._state.db


@admin.register(ConsolidationRun)
class ConsolidationRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "trigger", "status", "night", "word_count", "tokens_in", "tokens_out", "created_at"]
    list_filter = ["status", "trigger"]
    search_fields = ["summary_of_changes", "error"]
    list_select_related = ["kin"]


@admin.register(ExperienceVersion)
class ExperienceVersionAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "version", "word_count", "created_at"]
    search_fields = ["markdown"]
    list_select_related = ["kin"]
