"""Admin helpers shared by the apps."""


class ReadOnlyAdminMixin:
    """For audit tables: admins read them, nobody edits or deletes them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
