"""Cursor pagination for every list endpoint."""
from rest_framework.pagination import CursorPagination


class DefaultCursorPagination(CursorPagination):
    ordering = ("id",)
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class ChronologicalCursorPagination(DefaultCursorPagination):
    """Oldest first. Imported messages carry their own created_at, so id order is not time order."""

    ordering = ("created_at", "id")
