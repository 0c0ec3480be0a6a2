"""Admin: the record of kin imports, read-only (the import service writes it), scoped to the
staff member's teams like every team-owned table."""
from django.contrib import admin

from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin
from transfer.models import KinImport


@admin.register(KinImport)
class KinImportAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kin", "team", "format_version", "source_kin_id", "digest", "created_at"]
    list_filter = ["format_version"]
    search_fields = ["digest", "kin__name"]
    list_select_related = ["kin", "team"]
