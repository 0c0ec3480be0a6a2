"""Cursor pagination for every list endpoint."""
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class DefaultCursorPagination(CursorPagination):
    ordering = ("id",)
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def decode_cursor(self, request):
        # DRF answers 404 for a cursor it cannot decode; it is a bad parameter, not a missing object.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({self.cursor_query_param: ["Invalid cursor: pass back a `next` or `previous` link."]})


class ChronologicalCursorPagination(DefaultCursorPagination):
    """Oldest first. Imported messages carry their own created_at, so id order is not time order."""

    ordering = ("created_at", "id")
