"""Cursor pagination for every list endpoint."""
from base64 import b64decode

from django.core.exceptions import FieldDoesNotExist, ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class InvalidCursor(ValidationError):
    default_code = "invalid_cursor"


class DefaultCursorPagination(CursorPagination):
    ordering = ("id",)
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model  # decode_cursor checks the position against its ordering field
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        # DRF answers 404 for a cursor it cannot decode; it is a bad parameter, not a missing object.
        try:
            encoded = request.query_params.get(self.cursor_query_param)
            if encoded is not None:
                # DRF's lenient decoding skips stray characters, reading "%%%" as the first page.
                b64decode(encoded.encode("ascii"), validate=True)
            cursor = super().decode_cursor(request)
        except (ValueError, NotFound) as exc:  # ValueError: binascii.Error and UnicodeError included
            raise self._invalid() from exc
        if cursor is not None and cursor.position is not None:
            # DRF filters by the position as given, so one that is no value of the ordering
            # field (p=abc for an id or a date-time) would fail in the query: a 500.
            try:
                field = self._model._meta.get_field(self.ordering[0].lstrip("-"))
            except FieldDoesNotExist:  # an annotation: nothing to check it against
                return cursor
            try:
                field.to_python(cursor.position)
            except (DjangoValidationError, ValueError, TypeError, OverflowError) as exc:
                raise self._invalid() from exc
        return cursor

    def _invalid(self):
        return InvalidCursor({self.cursor_query_param: ["Invalid cursor: pass back a `next` or `previous` link."]})


class ChronologicalCursorPagination(DefaultCursorPagination):
    """Oldest first. Imported messages carry their own created_at, so id order is not time order."""

    ordering = ("created_at", "id")
