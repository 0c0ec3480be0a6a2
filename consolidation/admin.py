"""Admin for the fact ledger, consolidation runs and experience versions (audit rows are read-only)."""
from django.contrib import admin

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.admin_mixins import ReadOnlyAdminMixin


@admin.register(Fact)
class FactAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "category", "short_statement", "source", "status", "is_consolidated", "created_at"]
    list_filter = ["status", "is_consolidated", "category", "source"]
    search_fields = ["statement", "source_ref"]
    list_select_related = ["kin"]

    @admin.display(description="statement")
    def short_statement(self, fact):
        return fact.statement[:100]


@admin.register(ConsolidationRun)
class ConsolidationRunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "trigger", "status", "night", "word_count", "tokens_in", "tokens_out", "created_at"]
    list_filter = ["status", "trigger"]
    search_fields = ["summary_of_changes", "error"]
    list_select_related = ["kin"]


@admin.register(ExperienceVersion)
class ExperienceVersionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "version", "word_count", "created_at"]
    search_fields = ["markdown"]
    list_select_related = ["kin"]
