"""Reads for kins, sessions and the event store, all scoped to a team."""
from django.db import connection
from django.db.models import Count, Max, Q
from django.shortcuts import get_object_or_404

from kinsite.models import Team
from kinsite.textsearch import fts5_match_expression, query_terms, tsquery_expression
from sessions_app.models import Event, Kin, Session


def kin_list(*, team: Team):
    return Kin.objects.filter(team=team)


def kin_get(*, team: Team, kin_id: int) -> Kin:
    return get_object_or_404(Kin, team=team, pk=kin_id)


def session_list(*, team: Team, kin: Kin | None = None):
    qs = Session.objects.filter(kin__team=team)
    if kin is not None:
        qs = qs.filter(kin=kin)
    return qs


def session_get(*, team: Team, session_id: int) -> Session:
    return get_object_or_404(Session.objects.select_related("kin"), kin__team=team, pk=session_id)


def message_list(*, session: Session):
    return Event.objects.filter(session=session, kind=Event.Kind.MESSAGE)


def history_search(*, query: str, limit: int, session: Session | None = None, kin: Kin | None = None) -> list[Event]:
    """Messages of one session, or of all a kin's sessions, ranked by full-text
    relevance; each returned Event carries a `score` (higher is better)."""
    if (session is None) == (kin is None):
        raise ValueError("history_search needs exactly one of session or kin")
    terms = query_terms(query)
    if not terms:
        return []
    if session is not None:
        scope_sql, scope_param = "e.session_id = %s", session.pk
    else:
        scope_sql = "e.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %s)"
        scope_param = kin.pk
    if connection.vendor == "postgresql":
        ranked = _search_postgresql(terms, scope_sql, scope_param, limit)
    else:
        ranked = _search_sqlite(terms, scope_sql, scope_param, limit)
    events = Event.objects.in_bulk([event_id for event_id, _ in ranked])
    hits = []
    for event_id, score in ranked:
        event = events[event_id]
        event.score = float(score)
        hits.append(event)
    return hits


def _search_postgresql(terms, scope_sql, scope_param, limit):
    # search_tsv is a stored generated column with a partial GIN index (migration 0002).
    sql = f"""
        SELECT e.id, ts_rank(e.search_tsv, q, 1) AS score
        FROM sessions_app_event e, to_tsquery('english', %s) q
        WHERE e.kind = 'message' AND e.search_tsv @@ q AND {scope_sql}
        ORDER BY score DESC, e.id
        LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [tsquery_expression(terms), scope_param, limit])
        return cursor.fetchall()


def _search_sqlite(terms, scope_sql, scope_param, limit):
    # sessions_app_event_fts is an external-content FTS5 table kept by triggers (migration 0002).
    # bm25() is lower-is-better; weights: sender 0.5, content 1.0.
    sql = f"""
        SELECT e.id, -bm25(sessions_app_event_fts, 0.5, 1.0) AS score
        FROM sessions_app_event_fts
        JOIN sessions_app_event e ON e.id = sessions_app_event_fts.rowid
        WHERE sessions_app_event_fts MATCH %s AND {scope_sql}
        ORDER BY score DESC, e.id
        LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [fts5_match_expression(terms), scope_param, limit])
        return cursor.fetchall()


def kin_list_with_stats(*, team: Team, name_query: str = ""):
    """The team's kins, each with `session_count` and `last_activity_at` (None
    without sessions), optionally filtered by a case-insensitive name fragment."""
    qs = kin_list(team=team)
    if name_query:
        qs = qs.filter(name__icontains=name_query)
    return qs.annotate(
        session_count=Count("sessions"),
        last_activity_at=Max("sessions__last_activity_at"),
    ).order_by("name", "id")


def session_list_with_counts(*, team: Team, kin: Kin):
    """A kin's sessions, most recently active first, each with `message_count`."""
    return (
        session_list(team=team, kin=kin)
        .annotate(message_count=Count("events", filter=Q(events__kind=Event.Kind.MESSAGE)))
        .order_by("-last_activity_at", "-id")
    )
