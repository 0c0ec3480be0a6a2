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
        scope_sql, scope_param = "e.session_id = %(scope)s", session.pk
    else:
        scope_sql = "e.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %(scope)s)"
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


# BM25 parameters, the usual defaults (SQLite's FTS5 bm25() uses the same).
BM25_K1 = 1.2
BM25_B = 0.75
# A match in the sender name counts half a match in the content (as on SQLite).
SENDER_WEIGHT = 0.5


def _search_postgresql(terms, scope_sql, scope_param, limit):
    """BM25 over the stored tsvector (migration 0002: search_tsv, content weighted A,
    sender B, with a partial GIN index). ts_rank has no inverse document frequency,
    so the score is computed here: candidates come from the GIN index, term
    frequencies from the tsvector's positions, document frequencies and the
    average length from the search scope."""
    sql = f"""
        WITH query_lexemes AS (
            SELECT lexeme FROM unnest(to_tsvector('english', %(text)s))
        ),
        candidates AS (
            SELECT e.id, e.search_tsv, length(e.search_tsv) AS doc_length
            FROM sessions_app_event e
            WHERE e.kind = 'message' AND e.search_tsv @@ to_tsquery('english', %(tsquery)s) AND {scope_sql}
        ),
        matches AS (
            SELECT c.id, c.doc_length, v.lexeme,
                   (SELECT sum(CASE WHEN w = 'A' THEN 1.0 ELSE %(sender_weight)s END) FROM unnest(v.weights) w)
                       AS term_frequency
            FROM candidates c, unnest(c.search_tsv) v
            WHERE v.lexeme IN (SELECT lexeme FROM query_lexemes)
        ),
        document_frequency AS (
            SELECT lexeme, count(*) AS df FROM matches GROUP BY lexeme
        ),
        scope_stats AS (
            SELECT count(*) AS n, coalesce(avg(length(e.search_tsv)), 1) AS avg_length
            FROM sessions_app_event e
            WHERE e.kind = 'message' AND {scope_sql}
        )
        SELECT m.id,
               sum(
                   ln(1 + (s.n - d.df + 0.5) / (d.df + 0.5))
                   * m.term_frequency * (%(k1)s + 1)
                   / (m.term_frequency + %(k1)s * (1 - %(b)s + %(b)s * m.doc_length / s.avg_length))
               ) AS score
        FROM matches m
        JOIN document_frequency d ON d.lexeme = m.lexeme
        CROSS JOIN scope_stats s
        GROUP BY m.id
        ORDER BY score DESC, m.id
        LIMIT %(limit)s
    """
    params = {
        "text": " ".join(terms),
        "tsquery": tsquery_expression(terms),
        "scope": scope_param,
        "sender_weight": SENDER_WEIGHT,
        "k1": BM25_K1,
        "b": BM25_B,
        "limit": limit,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _search_sqlite(terms, scope_sql, scope_param, limit):
    # sessions_app_event_fts is an external-content FTS5 table kept by triggers (migration 0002).
    # bm25() is lower-is-better; weights: sender 0.5, content 1.0.
    sql = f"""
        SELECT e.id, -bm25(sessions_app_event_fts, 0.5, 1.0) AS score
        FROM sessions_app_event_fts
        JOIN sessions_app_event e ON e.id = sessions_app_event_fts.rowid
        WHERE sessions_app_event_fts MATCH %(match)s AND {scope_sql}
        ORDER BY score DESC, e.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"match": fts5_match_expression(terms), "scope": scope_param, "limit": limit})
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
