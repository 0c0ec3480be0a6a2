"""The web worker's request limits on their own (kinsite/webworker.py): which heads are
refused and with what status; tests/ops/test_edge_limits.py sends them to a real server."""
from types import SimpleNamespace

import h11

from kinsite.webworker import MAX_HEADERS, MAX_REQUEST_LINE, RequestLimits

LIMITS = RequestLimits(line=100, fields=3, field_size=50, read_timeout=10)


def request(target=b"/", headers=()):
    return h11.Request(method="GET", target=target, headers=[("Host", "localhost"), *headers])


def test_heads_within_the_limits_pass():
    # "GET " + target + " HTTP/1.1" is 100 bytes exactly; a field of 50 bytes with its ": ".
    assert LIMITS.refusal(request(b"/" + b"a" * 86, [("X-A", "b" * 45), ("X-B", "c")])) is None


def test_a_long_request_line_is_414():
    refused = LIMITS.refusal(request(b"/" + b"a" * 87))
    assert refused.error_status_hint == 414 and "101 > 100" in str(refused)


def test_a_long_field_or_too_many_fields_is_431():
    refused = LIMITS.refusal(request(headers=[("X-A", "b" * 46)]))
    assert refused.error_status_hint == 431 and "51 > 50" in str(refused)
    refused = LIMITS.refusal(request(headers=[("X-A", "1"), ("X-B", "2"), ("X-C", "3")]))
    assert refused.error_status_hint == 431 and "4 > 3" in str(refused)


def test_gunicorns_zero_means_its_ceiling_and_h11_buffers_no_more_than_a_whole_head():
    cfg = SimpleNamespace(limit_request_line=0, limit_request_fields=0, limit_request_field_size=0)
    limits = RequestLimits.from_gunicorn(cfg, read_timeout=5)
    assert (limits.line, limits.fields) == (MAX_REQUEST_LINE, MAX_HEADERS)
    assert LIMITS.head_bytes == 100 + 2 + 3 * 52 + 2
