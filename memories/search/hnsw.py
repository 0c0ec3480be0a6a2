"""Nearest vectors through pgvector's HNSW index (the pgvector mode of memories.vectorindex),
for scopes large enough that the index beats the exact scan of memories.search.vectors.

pgvector filters after the index scan: the index yields the hnsw.ef_search nearest of the
whole table (every team and kin), and only then are the scope's kept, so a small scope
silently gets fewer than k. Hence ef_search is set from the scope's share of the index
(hnsw_ef_search); a share too small even for the maximum, or a query that still brings
fewer than k rows, takes the exact path (nearest() returns None)."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from memories import vectorindex
from memories.search.candidates import kin_keys_sql

# pgvector's default and largest hnsw.ef_search.
EF_SEARCH_DEFAULT = 40
EF_SEARCH_MAX = 1000
# The index's candidates are not spread evenly over the scopes (a kin with 1% of the rows
# got half what its share predicts): ask for this many times the rows the share would give.
OVERSAMPLE = 2


def hnsw_ef_search(*, k: int, scope_rows: int, index_rows: int, min_scope: int) -> int | None:
    """The hnsw.ef_search that brings about k rows of a scope holding `scope_rows` of the
    index's `index_rows`, or None when the exact scan is the better path: a scope smaller
    than `min_scope` (scanned exactly about as fast, and never approximately), or a share
    so small that even EF_SEARCH_MAX would not bring k."""
    if k <= 0 or scope_rows < max(min_scope, k, 1):
        return None
    share = scope_rows / max(index_rows, scope_rows)
    ef_search = max(EF_SEARCH_DEFAULT, k, math.ceil(k * OVERSAMPLE / share))
    return ef_search if ef_search <= EF_SEARCH_MAX else None


# --- scope sizes -------------------------------------------------------------------------------

# A scope's count of vectors of a model, as this process last counted it (too slow to count
# at every search). Only its share of the index is drawn from it, and shares move slowly: a
# stale count at worst brings fewer than k rows, and the exact path answers.
_SIZE_TTL_SECONDS = 300.0
_sizes: dict[tuple, tuple[int, float]] = {}
_sizes_lock = threading.Lock()


def scope_sizes_forget() -> None:
    with _sizes_lock:
        _sizes.clear()


def scope_rows(team_id: int, kin_keys: list[int], model: str) -> int:
    """Active memories of the scopes with a vector of `model` (counted at most 5 minutes ago)."""
    db = connection.settings_dict
    key = (db.get("HOST"), db.get("PORT"), db.get("NAME"), team_id, tuple(kin_keys), model)
    with _sizes_lock:
        cached = _sizes.get(key)
    if cached is not None and time.monotonic() - cached[1] < _SIZE_TTL_SECONDS:
        return cached[0]
    scope, params = kin_keys_sql(kin_keys)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {vectorindex.MEMORY_TABLE} m WHERE m.team_id = %s AND {scope}"
            " AND m.status = 'active' AND m.embedding_model = %s",
            [team_id, *params, model],
        )
        count = int(cursor.fetchone()[0])
    with _sizes_lock:
        _sizes[key] = (count, time.monotonic())
    return count


# --- the query -------------------------------------------------------------------------------


def _vector_literal(query: np.ndarray) -> str:
    return "[" + ",".join(f"{float(x):.9g}" for x in query) + "]"


def hnsw_query_sql(*, dims: int, kin_keys: list[int]) -> str:
    """The statement nearest() runs (EXPLAIN-able as is): the ef_search nearest of the whole
    index in a materialised CTE (so the plan is the index's ORDER BY ... LIMIT, whatever
    the planner would guess about the scope), then the scope's and model's among them.
    Parameters: query vector, query vector, ef_search, team, the scope's kin ids, model, k."""
    expression = vectorindex.hnsw_expression(dims)
    return (
        f"WITH near AS MATERIALIZED ("
        f" SELECT memory_id, {expression} <=> %s::vector({dims}) AS distance FROM {vectorindex.VECTOR_TABLE}"
        f" WHERE {vectorindex.hnsw_predicate(dims)} ORDER BY {expression} <=> %s::vector({dims}) LIMIT %s)"
        f" SELECT near.memory_id, 1 - near.distance FROM near"
        f" JOIN {vectorindex.MEMORY_TABLE} m ON m.id = near.memory_id WHERE {_scope_filter(kin_keys)}"
        f" ORDER BY near.distance LIMIT %s"
    )


def hnsw_query_params(*, query: np.ndarray, ef_search: int, team_id: int, kin_keys: list[int], model: str,
                      k: int) -> list:
    literal = _vector_literal(query)
    _, kin_params = kin_keys_sql(kin_keys)
    return [literal, literal, ef_search, team_id, *kin_params, model, k]


def _scope_filter(kin_keys: list[int]) -> str:
    scope, _ = kin_keys_sql(kin_keys)
    return f"m.team_id = %s AND {scope} AND m.status = 'active' AND m.embedding_model = %s"


def nearest(*, team_id: int, kin_keys: list[int], model: str, query: np.ndarray, k: int,
            index_rows: int) -> dict[int, float] | None:
    """memories.search.vectors' k nearest through the ready HNSW index of the query's size,
    which holds about `index_rows` ({memory id: cosine}), or None when the exact path must
    answer: a scope too small or too small a share of the index, or fewer than k rows found."""
    rows_in_scope = scope_rows(team_id, kin_keys, model)
    ef_search = hnsw_ef_search(k=k, scope_rows=rows_in_scope, index_rows=index_rows,
                               min_scope=settings.MEMORY_VECTOR_HNSW_MIN_SCOPE)
    if ef_search is None:
        return None
    # No savepoint inside a caller's transaction (a write's duplicate check): two round trips
    # fewer, and an error here fails that transaction as it would anyway.
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # Transaction-local: inside a caller's it outlasts this query, but each HNSW query
        # sets its own.
        cursor.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef_search)])
        cursor.execute(hnsw_query_sql(dims=len(query), kin_keys=kin_keys),
                       hnsw_query_params(query=query, ef_search=ef_search, team_id=team_id, kin_keys=kin_keys,
                                         model=model, k=k))
        found = {memory_id: float(cosine) for memory_id, cosine in cursor.fetchall()}
    return found if len(found) >= min(k, rows_in_scope) else None


def similarities(*, team_id: int, kin_keys: list[int], model: str, query: np.ndarray,
                 ids: set[int]) -> dict[int, float]:
    """The cosines of the memories in `ids` that are active in the scopes with a vector of
    `model` (the text candidates beside the HNSW neighbours), computed by pgvector."""
    dims = len(query)
    _, kin_params = kin_keys_sql(kin_keys)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT v.memory_id, 1 - ({vectorindex.hnsw_expression(dims)} <=> %s::vector({dims}))"
            f" FROM {vectorindex.VECTOR_TABLE} v JOIN {vectorindex.MEMORY_TABLE} m ON m.id = v.memory_id"
            f" WHERE {_scope_filter(kin_keys)} AND {vectorindex.hnsw_predicate(dims)} AND v.memory_id = ANY(%s)",
            [_vector_literal(query), team_id, *kin_params, model, sorted(ids)],
        )
        return {memory_id: float(cosine) for memory_id, cosine in cursor.fetchall()}
