"""Reads for sessions and the event store, all scoped to a team (kin_get and kin_list are
kinsite.selectors', beside the model)."""
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
    """The team's sessions (of `kin`, archived or not as asked; None: all) as the API shows
    them: each with `message_count` and `summary_text` (its newest compaction summary, None
    before the first) read in the same query, so a page of them costs one query."""
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
    """The session of the team (404 otherwise) with only its id, its kin's id and whether it
    is archived read: for requests that need to know which session, not what it holds
    (history search; a chat turn, which reads the session with its kin under the session
    lock). Its other fields are deferred: one read, if any, loads them then (one query
    more). Written as SQL, as kinsite.selectors.kin_ref."""
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
    """Messages of one session, or of all a kin's sessions, ranked by full-text
    relevance with their neighbours' relevance as context (see rank_with_neighbours);
    each returned Event carries a `score` (higher is better)."""
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
        # One statement ranks (as rank_with_neighbours does) and returns the hits' rows.
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
# SQLite: from `scored` (id, session_id, created_at, score: every matching message of
# the scope), the best `pool` seeds with the ids of their neighbours, whose scores are
# then looked up in `scored`. (PostgreSQL scores a bounded pool, see _search_postgresql.)
_SEEDS_WITH_NEIGHBOURS = f"""
    seeds AS (
        SELECT id, session_id, created_at, score FROM scored ORDER BY score DESC, id LIMIT %(pool)s
    ),
    windows AS MATERIALIZED (
        SELECT s.id, s.score, {_PREVIOUS_MESSAGE} AS previous_id, {_NEXT_MESSAGE} AS next_id FROM seeds s
    )
"""
# Scope statistics for BM25 on PostgreSQL are read at query time, each at a cost that
# does not grow with the history : the number of messages from MessageCount
# (a few rows per session, kept by triggers), and the average message length from at
# most this many of the scope's messages (whichever the index yields first, not a random
# sample); message lengths do not drift much over a conversation, so an estimate is
# enough. The same sample estimates the document frequency of a term too common to be
# counted (see TERM_CANDIDATES).
SCOPE_SAMPLE = 1000
# How many postings (sessions_app_searchposting, migration 0018) a search reads per query
# term at most: the term's best, highest BM25 impact first (tf and length at a fixed
# typical length). This bounds a search's reads whatever the history length: a term on
# 50,000 messages (a speaker's name, an everyday word) costs what a term on 1,000 does.
# Below it, a term's document frequency is exact (all its postings were read); at it
# (the term is "capped"), the frequency is the sample's share times the scope's size,
# and at least TERM_CANDIDATES.
TERM_CANDIDATES = 1000
# When a query term is capped, the candidates' scores from the postings read miss that
# term wherever its posting was not among the best read, so this many of the best
# candidates are scored again from all their postings of the query's terms (two index
# probes each). Twice NEIGHBOUR_POOL, so that this can reorder the pool's edge before
# the neighbour step takes its seeds.
RESCORE_POOL = 200

# BM25 term score of a posting `p` (tf, doc_length) with the per-term constants of
# `term_weights` w (the scope's sampled average length). Computed for every posting read,
# so it is kept to four operations on columns of the posting and its term (no join per posting).
_BM25 = bm25.posting_score_sql("w.weight", "w.norm", "w.norm_per_lexeme", "p.tf", "p.doc_length")
_TERM_WEIGHTS = bm25.term_weights_sql(bm25.idf_sql("n.n", "d.df", vendor="postgresql"), "z.avg_length")
# The event table's columns of the hits, which PostgreSQL's statement returns with their scores.
_EVENT_COLUMNS = ", ".join(f"e.{field.column}" for field in Event._meta.concrete_fields)
# BM25 of the messages whose ids `{ids}` yields (a subquery), from all their postings of
# the query's terms: (event_id, score), computed only when a term is capped (a one-time
# filter: otherwise the postings read already hold every term of every candidate).
# Served by the postings' primary key (event_id, lexeme) INCLUDE (tf, doc_length).
_RESCORED = f"""
    SELECT p.event_id, sum({_BM25}) AS score
    FROM term_weights w
    JOIN sessions_app_searchposting p ON p.lexeme = w.lexeme
    WHERE EXISTS (SELECT 1 FROM capped) AND p.event_id IN ({{ids}})
    GROUP BY p.event_id
"""


def _search_postgresql(terms, scope, scope_param, pool, limit):
    """BM25 over the search postings (migration 0018: one row per message and lexeme of
    the stored search_tsv, with its term frequency (a sender match counts SENDER_WEIGHT),
    the message's length in lexemes and a BM25 impact at a fixed typical length), in one
    query whose reads are bounded whatever the history length:
    1. per query lexeme, its TERM_CANDIDATES best postings in the scope, from the btree
       index (scope, lexeme, impact DESC) that also holds their tf and length; their
       number gives the term's document frequency (see TERM_CANDIDATES), hence its idf
       over the scope's size (MessageCount);
    2. every message of those postings is a candidate, scored from them (tf, length
       normalised by the scope's sampled average length): exact when no term is capped;
       otherwise those of the best RESCORE_POOL that miss a posting of a capped term are
       scored again from all their postings;
    3. the best `pool` are the seeds of the neighbour step. A neighbour's score is its
       candidate score, or when a term is capped its score from all its postings (0 when
       it matches no query term);
    4. the best `limit` by rank_with_neighbours' formula, returned as Events with a `score`
       (the hits' rows come with the statement: no second query).
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
    without sessions) and its `imports` (what tells same-named kins apart), optionally
    filtered by a case-insensitive name fragment."""
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
