"""Pieces for serializers whose to_representation is written out by hand (the search
results, messages and the chat turn's answer). DRF's generic to_representation builds a
ModelSerializer's fields for every serializer and walks them, with a get_attribute and a
to_representation call, for every field of every row: on a search request that cost more
than the search itself (bench/README.md, "Request cost"). Those serializers keep their
declared fields: the schema is made from them, and tests compare each hand-written body
with DRF's generic one for the same object."""
from rest_framework import serializers

# DRF's own field, made once: ISO 8601 in the current time zone, "Z" for UTC, exactly as a
# serializer's DateTimeField writes it.
_DATETIME = serializers.DateTimeField(read_only=True)


def datetime_value(value):
    """A DateTimeField's JSON value (None stays None)."""
    return None if value is None else _DATETIME.to_representation(value)

