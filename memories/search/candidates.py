"""What both full-text dialects (postgres.py, sqlite.py) return: a TextMatch per
candidate, carrying the memory's row, so search reads no candidate again."""
from datetime import datetime
from typing import NamedTuple

from django.db import connection
from django.db.models import DateTimeField

from kinsite.models import Kin, Team
from kinsite.rawsql import aware_datetime
from memories.models import Memory

# A match in the subject counts half a match in the content (the tsvector weights it B,
# FTS5 gets the column weight); matching the subject is rewarded again by ranking.
SUBJECT_WEIGHT = 0.5


class TextMatch(NamedTuple):
    """A full-text candidate: its BM25 score, the fields ranking needs, and the memory's
    row (see memory_from_row)."""

    id: int
    score: float
    importance: int
    category: str
    updated_at: datetime
    subject: str
    row: tuple


def scope_sql(*, team: Team, kin: Kin | None, include_shared: bool) -> tuple[str, dict]:
    """The WHERE clause (table alias m) and its parameters for a kin's memories, plus the
    team-shared ones with include_shared; kin=None: the shared ones only."""
    params = {"team": team.pk}
    # PostgreSQL: the ids are cast to bigint, the columns' type, because btree_gin's
    # operator classes (migration 0003) only serve same-type comparisons.
    cast = "::bigint" if connection.vendor == "postgresql" else ""
    if kin is None:
        return f"m.team_id = %(team)s{cast} AND m.kin_id IS NULL", params
    params["kin"] = kin.pk
    if include_shared:
        return f"m.team_id = %(team)s{cast} AND (m.kin_id = %(kin)s{cast} OR m.kin_id IS NULL)", params
    return f"m.team_id = %(team)s{cast} AND m.kin_id = %(kin)s{cast}", params


def kin_keys_sql(kin_keys: list[int]) -> tuple[str, list]:
    """The kin condition (table alias m) and its parameters for scopes given as kin keys
    (a kin's id for its own memories, 0 for the team-shared ones), as the vector side
    names them (memories.search.vectors, .hnsw)."""
    own = [kin_key for kin_key in kin_keys if kin_key]
    parts = [f"m.kin_id IN ({', '.join(['%s'] * len(own))})"] if own else []
    if 0 in kin_keys:
        parts.append("m.kin_id IS NULL")
    return f"({' OR '.join(parts)})", own


# The columns a search hit is built from: all of a memory's. Timestamps travel as text and
# are parsed only for the hits (Django's timestamptz loader is Python, slow per candidate).
_HIT_FIELDS = list(Memory._meta.concrete_fields)
_HIT_TIMESTAMPS = {i for i, f in enumerate(_HIT_FIELDS) if isinstance(f, DateTimeField)}
_HIT_ATTNAMES = [f.attname for f in _HIT_FIELDS]


def hit_columns_sql(alias: str) -> str:
    return ", ".join(
        f"CAST({alias}.{f.column} AS TEXT)" if i in _HIT_TIMESTAMPS else f"{alias}.{f.column}"
        for i, f in enumerate(_HIT_FIELDS)
    )


def memory_from_row(row: tuple) -> Memory:
    """A Memory instance from the hit_columns_sql columns."""
    values = [aware_datetime(value) if i in _HIT_TIMESTAMPS and value is not None else value
              for i, value in enumerate(row)]
    return Memory.from_db(connection.alias, _HIT_ATTNAMES, values)


_HIT_POSITION = {attname: i for i, attname in enumerate(_HIT_ATTNAMES)}


def matches_by_id(ids: set[int], *, team: Team, kin: Kin | None, include_shared: bool) -> list[TextMatch]:
    """The active memories of the scope among `ids` as TextMatches of score 0 (found by
    vector alone), in one query. The scope is checked again so that no id, however it was
    found, reads a memory of another kin or team."""
    if not ids:
        return []
    where, params = scope_sql(team=team, kin=kin, include_shared=include_shared)
    params.update({"active": Memory.Status.ACTIVE, **{f"id{i}": memory_id for i, memory_id in enumerate(ids)}})
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {hit_columns_sql('m')} FROM {Memory._meta.db_table} m"
            f" WHERE {where} AND m.status = %(active)s"
            f" AND m.id IN ({', '.join(f'%(id{i})s' for i in range(len(ids)))})",
            params,
        )
        rows = cursor.fetchall()
    at = _HIT_POSITION
    return [TextMatch(row[at["id"]], 0.0, row[at["importance"]], row[at["category"]],
                      aware_datetime(row[at["updated_at"]]), row[at["subject"]], row) for row in rows]
