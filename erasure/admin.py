"""Admin: erasure receipts, read-only (erasure.services writes them), scoped to the staff
member's teams like every team-owned table."""
from django.contrib import admin

from erasure.models import Erasure
from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin


@admin.register(Erasure)
class ErasureAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "team", "sender", "subject", "kin_label", "actor", "created_at"]
    search_fields = ["sender", "subject", "actor"]
    list_select_related = ["team"]
    readonly_fields = ["team", "kin", "kin_label", "sender", "subject", "counts", "items", "actor", "actor_user",
                       "created_at"]
