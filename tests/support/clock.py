"""Moving the clock on for rows: their timestamps are pushed back instead."""
from datetime import timedelta

from django.db.models import F


def age(queryset, field: str, by: timedelta) -> None:
    """Move rows' timestamp `field` back by `by`, as if that much time had passed."""
    queryset.update(**{field: F(field) - by})
