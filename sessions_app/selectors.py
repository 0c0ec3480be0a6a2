"""Reads for sessions and the event store, all scoped to a team (kin reads are in kinsite.selectors)."""
from django.db import connection
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404
from django.shortcuts import get_object_or_404

from kinsite import bm25
from kinsite.models import Kin, Team
from kinsite.rawsql import aware_datetime
from kinsite.selectors import MAX_ROW_ID, kin_list
from kinsite.textsearch import fts5_match_expression, query_terms
from sessions_app.models import Event, IntrospectionRun, Session, Summary


def session_list(*, team: Team, kin: Kin | None = None):
    qs = Session.objects.filter(kin__team=team)
    if kin is not None:
        qs = qs.filter(kin=kin)
    return qs


def session_list_described(*, team: Team, kin: Kin | None = None, archived: bool | None = None):
    """The team's sessions (of `kin`; archived or not, None: all) as the API shows them, with
    `message_count` and `summary_text` (newest compaction summary) annotated: one query a page."""
    qs = session_list(team=team, kin=kin)
    if archived is not None:
        qs = qs.filter(archived_at__isnull=not archived)
    messages = (
        Event.objects.filter(session=OuterRef("pk"), kind=Event.Kind.MESSAGE)
        .order_by().values("session").annotate(n=Count("id")).values("n")
    )
    newest_summary = Summary.objects.filter(session=OuterRef("pk")).order_by("-created_at", "-id").values("content")
    return qs.annotate(
        message_count=Coalesce(Subquery(messages), 0),
        summary_text=Subquery(newest_summary[:1]),
    )


def session_get_described(*, team: Team, session_id: int) -> Session:
    """One session of the team (404 otherwise) as session_list_described reads it."""
    return get_object_or_404(session_list_described(team=team), pk=session_id)


def session_get(*, team: Team, session_id: int) -> Session:
    return get_object_or_404(Session.objects.select_related("kin__team"), kin__team=team, pk=session_id)


def session_ref(*, team: Team, session_id: int) -> Session:
    """The team's session (404 otherwise) with only id, kin_id and archived_at loaded, for requests
    that need which session, not its content (a chat turn rereads it under the lock). Raw SQL."""
    if not 0 < session_id <= MAX_ROW_ID:
        raise Http404
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.kin_id, s.archived_at FROM {Session._meta.db_table} s"
            f" JOIN {Kin._meta.db_table} k ON k.id = s.kin_id WHERE s.id = %s AND k.team_id = %s",
            [session_id, team.pk],
        )
        row = cursor.fetchone()
    if row is None:
        raise Http404
    kin_id, archived_at = row
    archived_at = None if archived_at is None else aware_datetime(archived_at)
    return Session.from_db(connection.alias, ["id", "kin_id", "archived_at"], [session_id, kin_id, archived_at])


def message_list(*, session: Session):
    return Event.objects.filter(session=session, kind=Event.Kind.MESSAGE)


def history_search(*, query: str, limit: int, session: Session | None = None, kin: Kin | None = None) -> list[Event]:
    """Messages of one session or of all a kin's sessions, ranked by full-text relevance with
    their neighbours' as context (rank_with_neighbours); each Event carries a `score`."""
    if (session is None) == (kin is None):
        raise ValueError("history_search needs exactly one of session or kin")
    terms = query_terms(query)
    if not terms:
        return []
    if session is not None:
        scope, scope_param, scope_sql = "session", session.pk, "e.session_id = %(scope)s"
    else:
        scope, scope_param = "kin", kin.pk
        scope_sql = "e.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %(scope)s)"
    pool = max(limit, NEIGHBOUR_POOL)
    if connection.vendor == "postgresql":
        return _search_postgresql(terms, scope, scope_param, pool, limit)
    windows = _search_sqlite(terms, scope_sql, scope_param, pool)
    ranked = rank_with_neighbours(windows)[:limit]
    events = Event.objects.in_bulk([event_id for event_id, _ in ranked])
    hits = []
    for event_id, score in ranked:
        event = events[event_id]
        event.score = score
        hits.append(event)
    return hits


# A match in the sender name counts half a match in the content (as on SQLite).
SENDER_WEIGHT = 0.5
# A question's words are often split over adjacent turns ("What did you research?" /
# "Adoption agencies."), so a message also earns this share of its better neighbour's
# score; half keeps its own words the main evidence.
NEIGHBOUR_WEIGHT = 0.5
# How many best messages are rescored with their neighbours: bounds the look-ups whatever
# the history length. Equals SEARCH_MAX_LIMIT so every limit ranks the same pool (a
# smaller limit returns a prefix of a larger one).
NEIGHBOUR_POOL = 100


def rank_with_neighbours(windows) -> list[tuple[int, float]]:
    """(id, score) best first, from rows (id, own score, previous's own score, next's own
    score; None for a neighbour that matched nothing). Context raises a match; it never
    turns a non-matching message into a hit."""
    scored = [
        (event_id, float(own) + NEIGHBOUR_WEIGHT * max(float(previous or 0), float(following or 0)))
        for event_id, own, previous, following in windows
    ]
    return sorted(scored, key=lambda hit: (-hit[1], hit[0]))


# The seed `s`'s previous and next message in its session, in Event.Meta order
# (created_at, id); served by the partial index event_message_timeline (migration 0003).
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
# SQLite: the best `pool` seeds of `scored` (every matching message of the scope) with
# their neighbours' ids, whose scores are then looked up in `scored`.
_SEEDS_WITH_NEIGHBOURS = f"""
    seeds AS (
        SELECT id, session_id, created_at, score FROM scored ORDER BY score DESC, id LIMIT %(pool)s
    ),
    windows AS MATERIALIZED (
        SELECT s.id, s.score, {_PREVIOUS_MESSAGE} AS previous_id, {_NEXT_MESSAGE} AS next_id FROM seeds s
    )
"""
# PostgreSQL's BM25 statistics cost the same whatever the history length: the count from
# MessageCount, the average length from at most this many of the scope's messages (the first
# the index yields: lengths drift little). The sample also estimates a capped term's df.
SCOPE_SAMPLE = 1000
# Postings (migration 0018) read per query term at most, best BM25 impact first, so a term on
# 50,000 messages costs what one on 1,000 does. Below the cap a term's df is exact; at it (the
# term is "capped") it is the sample's share times the scope's size, at least TERM_CANDIDATES.
TERM_CANDIDATES = 1000
# A capped term's unread postings miss from candidates' scores, so this many of the best are
# rescored; twice NEIGHBOUR_POOL, so rescoring can reorder the pool's edge before seeding.
RESCORE_POOL = 200

# BM25 term score of posting `p` with the constants of term_weights `w`. Computed for every
# posting read, so kept to four operations on their columns (no join per posting).
_BM25 = bm25.posting_score_sql("w.weight", "w.norm", "w.norm_per_lexeme", "p.tf", "p.doc_length")
_TERM_WEIGHTS = bm25.term_weights_sql(bm25.idf_sql("n.n", "d.df", vendor="postgresql"), "z.avg_length")
# The event table's columns of the hits, which PostgreSQL's statement returns with their scores.
_EVENT_COLUMNS = ", ".join(f"e.{field.column}" for field in Event._meta.concrete_fields)
# (event_id, score) of the messages `{ids}` from all their postings, only when a term is capped;
# served by the postings' primary key (event_id, lexeme) INCLUDE (tf, doc_length).
_RESCORED = f"""
    SELECT p.event_id, sum({_BM25}) AS score
    FROM term_weights w
    JOIN sessions_app_searchposting p ON p.lexeme = w.lexeme
    WHERE EXISTS (SELECT 1 FROM capped) AND p.event_id IN ({{ids}})
    GROUP BY p.event_id
"""


def _search_postgresql(terms, scope, scope_param, pool, limit):
    """BM25 over the search postings (migration 0018; a sender match counts SENDER_WEIGHT)
    in one query whose reads are bounded whatever the history length:
    1. per query lexeme, its TERM_CANDIDATES best postings in the scope (btree on scope,
       lexeme, impact DESC, holding tf and length); their count gives the term's idf;
    2. every message of those postings is a candidate scored from them: exact unless a
       term is capped, then the best RESCORE_POOL missing a capped posting are rescored;
    3. the best `pool` seed the neighbour step (a neighbour scores as in 2, 0 if no match);
    4. the best `limit` by rank_with_neighbours' formula come back as Events with `score`.
    Arithmetic is float8: numeric ln() and division cost more than the rest of the query.
    Lexemes come from to_tsvector over query_terms (word characters only)."""
    if scope == "session":
        posting_scope = "p.session_id = %(scope)s"
        count_scope = "c.session_id = %(scope)s"
        event_scope = "e.session_id = %(scope)s"
    else:
        posting_scope = "p.kin_id = %(scope)s"
        count_scope = "c.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %(scope)s)"
        event_scope = "e.session_id IN (SELECT id FROM sessions_app_session WHERE kin_id = %(scope)s)"
    sql = f"""
        WITH query_lexemes AS MATERIALIZED (
            SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %(text)s))
        ),
        scope_size AS MATERIALIZED (
            SELECT greatest(coalesce(sum(c.message_count), 0), 1)::float8 AS n
            FROM sessions_app_messagecount c WHERE {count_scope}
        ),
        sample AS MATERIALIZED (
            SELECT e.search_tsv FROM sessions_app_event e
            WHERE e.kind = 'message' AND {event_scope} LIMIT %(sample)s
        ),
        scope_sample AS MATERIALIZED (
            SELECT greatest(count(*), 1)::float8 AS size, coalesce(avg(length(search_tsv)), 1)::float8 AS avg_length
            FROM sample
        ),
        best_postings AS MATERIALIZED (
            SELECT q.lexeme, b.event_id, b.tf, b.doc_length
            FROM query_lexemes q
            CROSS JOIN LATERAL (
                SELECT p.event_id, p.tf, p.doc_length FROM sessions_app_searchposting p
                WHERE {posting_scope} AND p.lexeme = q.lexeme
                ORDER BY p.impact DESC LIMIT %(term_candidates)s
            ) b
        ),
        term_postings AS MATERIALIZED (
            SELECT lexeme, count(*)::float8 AS postings FROM best_postings GROUP BY lexeme
        ),
        -- A capped term (not all its postings read): how many of the sample's messages
        -- hold it (one pass over the sample per such term, its tsquery built once).
        capped_terms AS MATERIALIZED (
            SELECT lexeme, quote_literal(lexeme)::tsquery AS term FROM term_postings
            WHERE postings >= %(term_candidates)s
        ),
        capped AS MATERIALIZED (
            SELECT t.lexeme, n.n / z.size * (SELECT count(*) FROM sample s WHERE s.search_tsv @@ t.term) AS sampled_df
            FROM capped_terms t CROSS JOIN scope_size n CROSS JOIN scope_sample z
        ),
        term_weights AS MATERIALIZED (
            SELECT d.lexeme, d.capped,
                   {_TERM_WEIGHTS[0]} AS weight,
                   {_TERM_WEIGHTS[1]} AS norm,
                   {_TERM_WEIGHTS[2]} AS norm_per_lexeme
            FROM (
                SELECT t.lexeme, c.lexeme IS NOT NULL AS capped,
                       greatest(t.postings, coalesce(c.sampled_df, 0)) AS df
                FROM term_postings t LEFT JOIN capped c ON c.lexeme = t.lexeme
            ) d
            CROSS JOIN scope_size n CROSS JOIN scope_sample z
        ),
        candidates AS MATERIALIZED (
            SELECT p.event_id, sum({_BM25}) AS score, count(*) FILTER (WHERE w.capped) AS capped_read
            FROM best_postings p JOIN term_weights w ON w.lexeme = p.lexeme
            GROUP BY p.event_id
        ),
        rescore_pool AS MATERIALIZED (
            SELECT event_id, score, capped_read FROM candidates ORDER BY score DESC, event_id LIMIT %(rescore_pool)s
        ),
        -- A candidate whose postings read include one of every capped term already has its
        -- exact score; the others of the pool are rescored.
        rescored AS MATERIALIZED ({_RESCORED.format(
            ids="SELECT event_id FROM rescore_pool WHERE capped_read < (SELECT count(*) FROM capped)")}),
        -- Only the `pool` seeds are looked up in the event table.
        seeds AS MATERIALIZED (
            SELECT e.id, e.session_id, e.created_at, b.score FROM (
                SELECT c.event_id, coalesce(r.score, c.score) AS score
                FROM rescore_pool c LEFT JOIN rescored r ON r.event_id = c.event_id
                ORDER BY score DESC, c.event_id LIMIT %(pool)s
            ) b
            JOIN sessions_app_event e ON e.id = b.event_id
        ),
        windows AS MATERIALIZED (
            SELECT s.id, s.score, {_PREVIOUS_MESSAGE} AS previous_id, {_NEXT_MESSAGE} AS next_id FROM seeds s
        ),
        neighbours_rescored AS MATERIALIZED ({_RESCORED.format(
            ids="SELECT previous_id FROM windows UNION SELECT next_id FROM windows")}),
        neighbour_scores AS (
            SELECT event_id, score FROM candidates WHERE NOT EXISTS (SELECT 1 FROM capped)
            UNION ALL
            SELECT event_id, score FROM neighbours_rescored
        ),
        -- rank_with_neighbours, in SQL: the best `limit` windows by their own score plus
        -- NEIGHBOUR_WEIGHT times their better neighbour's; then the hits' rows, best first.
        ranked AS MATERIALIZED (
            SELECT w.id, w.score + %(neighbour_weight)s::float8
                * greatest(coalesce(previous.score, 0), coalesce(following.score, 0)) AS score
            FROM windows w
            LEFT JOIN neighbour_scores previous ON previous.event_id = w.previous_id
            LEFT JOIN neighbour_scores following ON following.event_id = w.next_id
            ORDER BY score DESC, w.id LIMIT %(limit)s
        )
        SELECT {_EVENT_COLUMNS}, r.score FROM ranked r JOIN sessions_app_event e ON e.id = r.id
        ORDER BY r.score DESC, r.id
    """
    params = {
        "text": " ".join(terms),
        "scope": scope_param,
        **bm25.PARAMS,
        "sample": SCOPE_SAMPLE,
        "term_candidates": TERM_CANDIDATES,
        "rescore_pool": max(RESCORE_POOL, pool),
        "pool": pool,
        "neighbour_weight": NEIGHBOUR_WEIGHT,
        "limit": limit,
    }
    return list(Event.objects.raw(sql, params))


def _search_sqlite(terms, scope_sql, scope_param, pool):
    # sessions_app_event_fts: external-content FTS5 kept by triggers (migration 0002).
    # bm25() is lower-is-better; its statistics are the FTS table's, across all sessions.
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
    """The team's kins (optionally by a name fragment), each with `session_count`,
    `last_activity_at` and its `imports` (what tells same-named kins apart)."""
    qs = kin_list(team=team)
    if name_query:
        qs = qs.filter(name__icontains=name_query)
    return qs.annotate(
        session_count=Count("sessions"),
        last_activity_at=Max("sessions__last_activity_at"),
    ).prefetch_related("imports").order_by("name", "id")


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
