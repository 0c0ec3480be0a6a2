"""The API's JSON parser (REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]): DRF's, plus the limits
that keep bad bodies a clear 4xx instead of a 500 somewhere later.

- A body over DATA_UPLOAD_MAX_MEMORY_SIZE answers 413, read no further than the limit.
- Nesting deeper than MAX_DEPTH answers 400. Python's json raises RecursionError (not
  ValueError, which DRF catches) around 1,000 levels, and a document a little shallower
  than that still breaks json.dumps, PostgreSQL's jsonb or code walking it later.
- 1e400 (infinity to Python) answers 400: JSON cannot carry it back out and jsonb refuses it.
- A NUL character or a lone surrogate (\\ud800) in any string or key answers 400:
  PostgreSQL text cannot hold NUL, and a lone surrogate cannot be encoded as UTF-8 at all,
  so either would fail when stored or rendered, whatever the field.
"""
import json
import math
import re

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser, get_encoding
from rest_framework.renderers import JSONRenderer

MAX_DEPTH = 100
UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _strict_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _where(path: tuple) -> str:
    where = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")
    return where or "the top level"


def _check(data) -> None:
    """Walks the parsed document without recursion: depth, and every key and string."""
    stack = [(data, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise exceptions.ParseError(f"JSON is nested deeper than {MAX_DEPTH} levels (at {_where(path)}).")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str) and UNSTORABLE_CHARACTER.search(key):
                    raise exceptions.ParseError(
                        f"A key at {_where(path)} contains a NUL character or a lone surrogate, which cannot be stored."
                    )
                stack.append((child, (*path, key), depth + 1))
        elif isinstance(value, str) and UNSTORABLE_CHARACTER.search(value):
            raise exceptions.ParseError(
                f"The text at {_where(path)} contains a NUL character (\\u0000) or a lone surrogate, "
                "which cannot be stored."
            )


class JSONParser(BaseParser):
    # Not a subclass of DRF's JSONParser on purpose: for those, DRF reads request.body
    # before the parser runs, and Django answers a body over the limit with its own HTML
    # 400 (RequestDataTooBig); reading the stream here lets the API answer 413 in its shape.
    media_type = "application/json"
    renderer_class = JSONRenderer

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = get_encoding(parser_context)
        raw = self._read(stream, parser_context)
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"JSON parse error - the body is not valid {encoding}: {exc.reason}.") from exc
        try:
            data = json.loads(text, parse_constant=_strict_constant, parse_float=_finite_float)
        except RecursionError:
            raise exceptions.ParseError(f"JSON is nested deeper than {MAX_DEPTH} levels.") from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
        _check(data)
        return data

    # The setting that caps the body; a view that takes larger documents (a kin import) uses a
    # subclass naming its own.
    limit_setting = "DATA_UPLOAD_MAX_MEMORY_SIZE"

    def _read(self, stream, parser_context) -> bytes:
        limit = getattr(settings, self.limit_setting)
        if limit is None:
            return stream.read()
        request = parser_context.get("request")
        meta = request.META if request is not None else {}
        too_large = RequestTooLarge(f"The request body is larger than {limit:,} bytes ({self.limit_setting}).")
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise too_large
        raw = stream.read(limit + 1)  # never more than the limit, whatever the header said
        if len(raw) > limit:
            raise too_large
        return raw
