"""Helpers for rows read with a raw cursor (`connection.cursor()`), where Django's field
conversions do not run."""
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime


def aware_datetime(value: str | datetime) -> datetime:
    """A timestamp column as an aware datetime. SQLite returns the stored text (UTC with
    USE_TZ); PostgreSQL a datetime, or text where the query casts it (`CAST(... AS TEXT)`,
    cheaper than Django's Python timestamptz loader when only some rows are read)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if settings.USE_TZ and timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value
