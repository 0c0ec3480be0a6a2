"""Pieces for serializers whose to_representation is written out by hand (search results,
messages, the chat turn's answer), since DRF's generic one cost more than the search itself.
They keep their declared fields, which the schema is made from; tests compare each
hand-written body with DRF's generic one."""
from rest_framework import serializers

# DRF's own field, made once, so values read exactly as a serializer's DateTimeField writes them.
_DATETIME = serializers.DateTimeField(read_only=True)


def datetime_value(value):
    """A DateTimeField's JSON value (None stays None)."""
    return None if value is None else _DATETIME.to_representation(value)

