"""Reads for sessions and the event store, all scoped to a team (kin_get and kin_list are
kinsite.selectors', beside the model)."""
from django.db import connection
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from kinsite.models import Kin, Team
from kinsite.selectors import kin_list
from kinsite.softcache import soft_cache_get, soft_cache_set
from kinsite.textsearch import fts5_match_expression, query_terms
from sessions_app.models import Event, IntrospectionRun, Session


def session_list(*, team: Team, kin: Kin | None = None):
    qs = Session.objects.filter(kin__team=team)
    if kin is not None:
        qs = qs.filter(kin=kin)
    return qs


def session_get(*, team: Team, session_id: int) -> Session:
    return get_object_or_404(Session.objects.select_related("kin__team"), kin__team=team, pk=session_id)


def message_list(*, session: Session):
    return Event.objects.filter(session=session, kind=Event.Kind.MESSAGE)


def history_search(*, query: str, limit: int, session: Session | None = None, kin: Kin | None = None) -> list[Event]:
    """Messages of one session, or of all a kin's sessions, ranked by full-text
    relevance with their neighbours' relevance as context (see rank_with_neighbours);
    each returned Event carries a `score` (higher is better)."""
    if (session is None) == (kin is None):
        raise ValueError("history_search needs exactly one of session or kin")
    terms = query_terms(query)
    if not terms:
        return []
    if session is not None:
        scope_sql, scope_param, scope_key = "e.session_id = %(scope)s", session.pk, f"session:{session.pk}"
    else:
        scope_sql = "e.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %(scope)s)"
        scope_param, scope_key = kin.pk, f"kin:{kin.pk}"
    pool = max(limit, NEIGHBOUR_POOL)
    if connection.vendor == "postgresql":
        common = _common_lexemes_postgresql(scope_sql, scope_param, scope_key)
        windows = _search_postgresql(terms, scope_sql, scope_param, pool, common)
    else:
        windows = _search_sqlite(terms, scope_sql, scope_param, pool)
    ranked = rank_with_neighbours(windows)[:limit]
    events = Event.objects.in_bulk([event_id for event_id, _ in ranked])
    hits = []
    for event_id, score in ranked:
        event = events[event_id]
        event.score = score
        hits.append(event)
    return hits


# BM25 parameters, the usual defaults (SQLite's FTS5 bm25() uses the same).
BM25_K1 = 1.2
BM25_B = 0.75
# A match in the sender name counts half a match in the content (as on SQLite).
SENDER_WEIGHT = 0.5
# In a conversation the words of a question are often split over a turn and the
# one before or after it ("What did you research?" / "Adoption agencies."), so
# a message also earns this share of its better-scoring adjacent message's score.
# Half: the message's own words stay the main evidence.
NEIGHBOUR_WEIGHT = 0.5
# How many of the best-scoring messages are rescored with their neighbours. It
# bounds the neighbour look-ups (two index probes each) whatever the history
# length, and equals SEARCH_MAX_LIMIT so that every allowed limit ranks the same
# pool: a smaller limit returns a prefix of a larger one.
NEIGHBOUR_POOL = 100


def rank_with_neighbours(windows) -> list[tuple[int, float]]:
    """(id, score) best first, from rows (id, own score, previous message's own
    score, next message's own score); a neighbour that matched no query word
    scores 0. Only messages that match the query are ranked: context raises a
    match, it does not turn a non-matching message into a hit."""
    scored = [
        (event_id, float(own) + NEIGHBOUR_WEIGHT * max(float(previous or 0), float(following or 0)))
        for event_id, own, previous, following in windows
    ]
    return sorted(scored, key=lambda hit: (-hit[1], hit[0]))


# The messages just before and just after a seed, in the order of Event.Meta
# (created_at, id), within the seed's session; served by the partial index
# event_message_timeline (migration 0003). `s` is the seed row.
_PREVIOUS_MESSAGE = """(
    SELECT m.id FROM sessions_app_event m
    WHERE m.session_id = s.session_id AND m.kind = 'message' AND (m.created_at, m.id) < (s.created_at, s.id)
    ORDER BY m.created_at DESC, m.id DESC LIMIT 1
)"""
_NEXT_MESSAGE = """(
    SELECT m.id FROM sessions_app_event m
    WHERE m.session_id = s.session_id AND m.kind = 'message' AND (m.created_at, m.id) > (s.created_at, s.id)
    ORDER BY m.created_at, m.id LIMIT 1
)"""
# From `scored` (id, session_id, created_at, score: every matching message of the
# scope), the best `pool` seeds with the ids of their neighbours. Each backend
# then looks up the neighbours' scores in `scored` the way its planner does best.
_SEEDS_WITH_NEIGHBOURS = f"""
    seeds AS (
        SELECT id, session_id, created_at, score FROM scored ORDER BY score DESC, id LIMIT %(pool)s
    ),
    windows AS MATERIALIZED (
        SELECT s.id, s.score, {_PREVIOUS_MESSAGE} AS previous_id, {_NEXT_MESSAGE} AS next_id FROM seeds s
    )
"""
# Scope statistics for BM25 on PostgreSQL: the average message length is taken
# over at most this many of the scope's messages (whichever the index yields
# first, not a random sample) rather than all of them, so reading it does not
# grow with the history; BM25 only uses it to normalise lengths, and message
# lengths do not drift much over a conversation, so an estimate is enough.
LENGTH_SAMPLE = 1000
# Common terms (PostgreSQL). A lexeme in at least this share of the scope's messages,
# and in at least COMMON_TERM_MIN_DOCS of them, is common: it still scores, but it does
# not pull messages in as candidates (memories.search.postgres does the same, after Lucene's
# CommonTermsQuery). In a conversation the common lexemes are the speakers' names (the
# sender is indexed) and the conversation's everyday words; a question naming a speaker
# used to score every message that speaker sent, which was most of a search's time at
# 10,000 messages. A query made only of common terms (or whose other terms match
# nothing) takes its candidates from its rarest common term.
COMMON_TERM_SHARE = 0.05
COMMON_TERM_MIN_DOCS = 1000
# Which lexemes are common is read with ts_stat() over every message of the scope, tens
# of milliseconds at 10,000 messages, so it is cached per scope for this long; a minute
# old list barely changes which messages are candidates.
COMMON_TERMS_SECONDS = 60


def _common_lexemes_postgresql(scope_sql, scope_param, scope_key) -> dict[str, int]:
    """The scope's common lexemes (see COMMON_TERM_SHARE) with their document counts."""
    key = f"sessions:history-common:v1:{scope_key}"
    common = soft_cache_get(key, what="history search's common terms")
    if common is None:
        # ts_stat() takes its rows as query text, so the scope's id (an integer) is written into it.
        rows_sql = f"SELECT e.search_tsv FROM sessions_app_event e WHERE e.kind = 'message' AND {scope_sql}"
        sql = f"""
            SELECT word, ndoc FROM ts_stat(%(rows)s)
            WHERE ndoc >= greatest(%(min_docs)s, ceil(%(share)s * (
                SELECT count(*) FROM sessions_app_event e WHERE e.kind = 'message' AND {scope_sql}
            )))
        """
        params = {"rows": rows_sql % {"scope": int(scope_param)}, "scope": scope_param,
                  "min_docs": COMMON_TERM_MIN_DOCS, "share": COMMON_TERM_SHARE}
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            common = {word: int(ndoc) for word, ndoc in cursor.fetchall()}
        soft_cache_set(key, common, COMMON_TERMS_SECONDS)
    return common


def _search_postgresql(terms, scope_sql, scope_param, pool, common):
    """BM25 over the stored tsvector (migration 0002: search_tsv, content weighted A,
    sender B, with a partial GIN index). ts_rank has no inverse document frequency,
    so the score is computed here: candidates come from the GIN index (messages
    matching the query's lexemes that are not `common`, see COMMON_TERM_SHARE), term
    frequencies from the tsvector's weights (one per position), document
    frequencies from the candidates (for a common lexeme, from `common`), the number
    of messages from the scope (an index-only count on event_message_timeline) and the
    average length from a sample of it. Arithmetic is float8: numeric ln() and division
    cost more than the rest of the query.

    The split into common and other lexemes happens here, in SQL, so a search stays two
    queries (this one and reading the hits). Lexemes come from query_terms (word
    characters only), and quote_literal makes each one a single tsquery operand."""
    candidate_columns = "e.id, e.session_id, e.created_at, e.search_tsv, length(e.search_tsv)::float8 AS doc_length"
    sql = f"""
        WITH query_lexemes AS MATERIALIZED (
            SELECT q.lexeme, c.df AS common_df
            FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %(text)s))) q
            LEFT JOIN unnest(%(common_lexemes)s::text[], %(common_df)s::float8[]) AS c (lexeme, df)
                ON c.lexeme = q.lexeme
        ),
        rare_matches AS MATERIALIZED (
            SELECT {candidate_columns}
            FROM sessions_app_event e
            WHERE e.kind = 'message' AND {scope_sql} AND e.search_tsv @@ (
                SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM query_lexemes WHERE common_df IS NULL
            )
        ),
        candidates AS (
            SELECT * FROM rare_matches
            UNION ALL
            -- Planned as a one-time filter: this scan only runs when no rare lexeme matched.
            SELECT {candidate_columns}
            FROM sessions_app_event e
            WHERE NOT EXISTS (SELECT 1 FROM rare_matches)
              AND e.kind = 'message' AND {scope_sql} AND e.search_tsv @@ (
                SELECT quote_literal(lexeme)::tsquery FROM query_lexemes
                WHERE common_df IS NOT NULL ORDER BY common_df, lexeme LIMIT 1
            )
        ),
        matches AS MATERIALIZED (
            SELECT c.id, c.session_id, c.created_at, c.doc_length, v.lexeme,
                   cardinality(v.weights)
                   - (1 - %(sender_weight)s::float8) * cardinality(array_positions(v.weights, 'B')) AS term_frequency
            FROM candidates c, unnest(c.search_tsv) v
            WHERE v.lexeme IN (SELECT lexeme FROM query_lexemes)
        ),
        document_frequency AS (
            SELECT m.lexeme, coalesce(q.common_df, count(*)::float8) AS df
            FROM matches m JOIN query_lexemes q ON q.lexeme = m.lexeme
            GROUP BY m.lexeme, q.common_df
        ),
        scope_size AS (
            SELECT count(*)::float8 AS n FROM sessions_app_event e WHERE e.kind = 'message' AND {scope_sql}
        ),
        length_sample AS (
            SELECT coalesce(avg(length(e.search_tsv)), 1)::float8 AS avg_length
            FROM (
                SELECT e.search_tsv FROM sessions_app_event e
                WHERE e.kind = 'message' AND {scope_sql} LIMIT %(length_sample)s
            ) e
        ),
        scored AS MATERIALIZED (
            SELECT m.id, m.session_id, m.created_at,
                   sum(
                       ln(1 + (greatest(n.n, d.df) - d.df + 0.5) / (d.df + 0.5))
                       * m.term_frequency * (%(k1)s::float8 + 1)
                       / (m.term_frequency
                          + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * m.doc_length / l.avg_length))
                   ) AS score
            FROM matches m
            JOIN document_frequency d ON d.lexeme = m.lexeme
            CROSS JOIN scope_size n
            CROSS JOIN length_sample l
            GROUP BY m.id, m.session_id, m.created_at
        ),
        {_SEEDS_WITH_NEIGHBOURS}
        SELECT w.id, w.score, previous.score, following.score
        FROM windows w
        LEFT JOIN scored previous ON previous.id = w.previous_id
        LEFT JOIN scored following ON following.id = w.next_id
    """
    params = {
        "text": " ".join(terms),
        "common_lexemes": list(common),
        "common_df": [float(df) for df in common.values()],
        "scope": scope_param,
        "sender_weight": SENDER_WEIGHT,
        "k1": BM25_K1,
        "b": BM25_B,
        "length_sample": LENGTH_SAMPLE,
        "pool": pool,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _search_sqlite(terms, scope_sql, scope_param, pool):
    # sessions_app_event_fts is an external-content FTS5 table kept by triggers (migration 0002).
    # bm25() is lower-is-better; weights: sender 0.5, content 1.0. Its statistics (number
    # of rows, average length) are the FTS table's, across all sessions.
    sql = f"""
        WITH scored AS MATERIALIZED (
            SELECT e.id, e.session_id, e.created_at, -bm25(sessions_app_event_fts, 0.5, 1.0) AS score
            -- CROSS JOIN keeps the FTS match as the outer loop: otherwise SQLite may walk the
            -- scope's messages through a covering index and run the match once per message.
            FROM sessions_app_event_fts
            CROSS JOIN sessions_app_event e ON e.id = sessions_app_event_fts.rowid
            WHERE sessions_app_event_fts MATCH %(match)s AND {scope_sql}
        ),
        {_SEEDS_WITH_NEIGHBOURS}
        -- Scalar look-ups, which SQLite serves from an automatic index on `scored`;
        -- with LEFT JOINs it scans `scored` once per seed.
        SELECT w.id, w.score,
               (SELECT score FROM scored WHERE id = w.previous_id),
               (SELECT score FROM scored WHERE id = w.next_id)
        FROM windows w
    """
    params = {"match": fts5_match_expression(terms), "scope": scope_param, "pool": pool}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
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


def session_list_with_counts(*, team: Team, kin: Kin, include_archived: bool = False):
    """A kin's sessions, most recently active first, each with `message_count`; archived
    ones only with `include_archived`."""
    qs = session_list(team=team, kin=kin)
    if not include_archived:
        qs = qs.filter(archived_at__isnull=True)
    return (
        qs
        .annotate(message_count=Count("events", filter=Q(events__kind=Event.Kind.MESSAGE)))
        .order_by("-last_activity_at", "-id")
    )


def session_archived_count(*, team: Team, kin: Kin) -> int:
    return session_list(team=team, kin=kin).filter(archived_at__isnull=False).count()


def session_get_with_event_count(*, team: Team, session_id: int, kinds) -> Session:
    """session_get, with `event_count`: how many of its events are of `kinds`, counted in
    the same query (the chat page pages its conversation with it)."""
    counted = (
        Event.objects.filter(session=OuterRef("pk"), kind__in=kinds)
        .order_by().values("session").annotate(n=Count("id")).values("n")
    )
    sessions = Session.objects.select_related("kin").annotate(event_count=Coalesce(Subquery(counted), 0))
    return get_object_or_404(sessions, kin__team=team, pk=session_id)


def introspection_run_list(*, session: Session):
    """A session's introspection runs, newest first (slice it: one query)."""
    return IntrospectionRun.objects.filter(session=session).order_by("-created_at", "-id")
