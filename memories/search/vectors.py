"""The vector side of memory search: an exact nearest-neighbour scan over every stored
vector of a scope (no recency cap), as a float32 numpy matrix; in pgvector mode, scopes the
HNSW index serves well go through it instead (search/hnsw.py). A scope is a kin's own
memories or its team's shared ones. Only vectors of the query's model and dimensions are
scanned: models are never mixed.

Each process keeps its matrices in an LRU capped by settings.MEMORY_VECTOR_CACHE_MB (a
larger scope is read whole at every search). Before each use it reads the scopes'
MemoryVectorScope rows (one query): database triggers bump a scope's generation in the
transaction of every write that changes a memory's vector, model, status, kin or team,
whatever wrote it, and stamp the memory's vector_seq with it (migrations 0006, 0008). A
newer generation patches in the rows stamped since; a newer epoch (a memory left the
scope) or another scope row (recreated) reloads. A reader whose transaction may see
uncommitted rows uses them for its query but never caches them.

Search scans exactly (nearest_start); the duplicate check shortlists by bit codes first
(near_duplicates_start; vector_matrix.CODE_BITS). The database is read on the caller's
thread and the numpy work runs on a scan thread, overlapping the caller's full-text query."""
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from django.conf import settings
from django.db import connection

from kinsite.models import Kin, Team
from memories import vectorindex
from memories.embeddings import Embedding
from memories.models import Memory, MemoryVector, MemoryVectorScope
from memories.search import hnsw
from memories.search.candidates import kin_keys_sql
from memories.search.vector_matrix import _bit_codes, _Matrix, _State, _View

_SCOPE_TABLE = MemoryVectorScope._meta.db_table
_MEMORY_TABLE = Memory._meta.db_table
_VECTOR_TABLE = MemoryVector._meta.db_table

# --- the per-process cache --------------------------------------------------------------------

_cache: OrderedDict[tuple, _Matrix] = OrderedDict()
_cache_lock = threading.Lock()


def vector_cache_clear() -> None:
    """Forget every matrix this process holds, and the scope sizes the HNSW path counted
    (tests; memory pressure)."""
    with _cache_lock:
        _cache.clear()
    hnsw.scope_sizes_forget()


def vector_cache_bytes() -> int:
    with _cache_lock:
        return sum(matrix.nbytes for matrix in _cache.values())


def _cache_get(key: tuple) -> _Matrix | None:
    with _cache_lock:
        matrix = _cache.get(key)
        if matrix is not None:
            _cache.move_to_end(key)
        return matrix


def _cache_put(key: tuple, matrix: _Matrix) -> bool:
    """Cache the matrix (False: it is larger than the cap)."""
    cap = settings.MEMORY_VECTOR_CACHE_MB * 1024 * 1024
    with _cache_lock:
        _cache.pop(key, None)
        if matrix.nbytes > cap:
            return False
        _cache[key] = matrix
        total = sum(m.nbytes for m in _cache.values())
        while total > cap:
            _, evicted = _cache.popitem(last=False)
            total -= evicted.nbytes
    return True


def _cache_key(team_id: int, kin_key: int, model: str, dims: int) -> tuple:
    # The database too: a process (a test run) may talk to more than one.
    db = connection.settings_dict
    return (connection.vendor, db.get("HOST"), db.get("PORT"), db.get("NAME"), team_id, kin_key, model, dims)


# --- reading the database ---------------------------------------------------------------------


def _scope_where(kin_key: int) -> str:
    return "m.team_id = %s AND m.kin_id = %s" if kin_key else "m.team_id = %s AND m.kin_id IS NULL"


def _scope_params(team_id: int, kin_key: int) -> list:
    return [team_id, kin_key] if kin_key else [team_id]


def _read_states(team_id: int, kin_keys: list[int], dims: int) -> tuple[dict[int, _State], int | None]:
    """The scopes' MemoryVectorScope rows and, on PostgreSQL in the same query, the row
    count of a valid HNSW index of `dims`-sized vectors (None without one): (states, count).
    So asking costs the exact path no extra query."""
    if connection.vendor == "postgresql":
        # A transaction that wrote nothing has no transaction id, and sees committed rows only.
        committed = "pg_current_xact_id_if_assigned() IS NULL"
        index = ("(SELECT CASE WHEN i.indisvalid AND i.indisready THEN greatest(c.reltuples, 0)::bigint END"
                 " FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid WHERE c.oid = to_regclass(%s))")
        index_params = [vectorindex.hnsw_index_name(dims)]
    else:
        # SQLite has no such question: outside a transaction block every read is committed.
        committed = "0" if connection.in_atomic_block or not connection.get_autocommit() else "1"
        index, index_params = "NULL", []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {committed}, {index}, s.kin_key, s.id, s.generation, s.epoch FROM (SELECT 1 AS one) AS x"
            f" LEFT JOIN {_SCOPE_TABLE} s ON s.team_id = %s AND s.kin_key IN ({', '.join(['%s'] * len(kin_keys))})",
            [*index_params, team_id, *kin_keys],
        )
        rows = cursor.fetchall()
    committed_view, index_rows = bool(rows[0][0]), rows[0][1]
    found = {kin_key: (scope_id, generation, epoch) for _, _, kin_key, scope_id, generation, epoch in rows
             if scope_id is not None}
    states = {
        kin_key: _State(*found.get(kin_key, (0, 0, 0)), committed_view=committed_view)
        for kin_key in kin_keys
    }
    return states, (None if index_rows is None else int(index_rows))


def _normalised(data, dims: int) -> np.ndarray | None:
    if data is None or len(data) != dims * 4:
        return None
    vector = np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


def _load(team_id: int, kin_keys: list[int], model: str, dims: int,
          states: dict[int, _State]) -> dict[int, _Matrix]:
    """Every active vector of the scopes made by `model` with `dims` dimensions, in one query."""
    scope, kin_params = kin_keys_sql(kin_keys)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(m.kin_id, 0), m.id, v.vector FROM {_MEMORY_TABLE} m"
            f" JOIN {_VECTOR_TABLE} v ON v.memory_id = m.id"
            f" WHERE m.team_id = %s AND {scope} AND m.status = %s AND m.embedding_model = %s",
            [team_id, *kin_params, Memory.Status.ACTIVE, model],
        )
        rows = cursor.fetchall()
    matrices = {}
    for kin_key in kin_keys:
        scope_rows = [(memory_id, bytes(data)) for key, memory_id, data in rows
                      if key == kin_key and len(data) == dims * 4]
        vectors = np.frombuffer(b"".join(data for _, data in scope_rows), dtype="<f4").astype(np.float32)
        vectors = vectors.reshape(-1, dims)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        matrices[kin_key] = _Matrix(dims=dims, state=states[kin_key],
                                    ids=[memory_id for memory_id, _ in scope_rows], vectors=vectors)
    return matrices


def _changes(team_id: int, kin_key: int, model: str, dims: int, since: int) -> dict[int, np.ndarray | None]:
    """The scope's rows stamped after generation `since`: a normalised vector for the
    ones the matrix holds now, None for the ones it no longer holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT m.id, m.status, m.embedding_model, v.vector FROM {_MEMORY_TABLE} m"
            f" LEFT JOIN {_VECTOR_TABLE} v ON v.memory_id = m.id"
            f" WHERE {_scope_where(kin_key)} AND m.vector_seq > %s",
            [*_scope_params(team_id, kin_key), since],
        )
        rows = cursor.fetchall()
    return {
        memory_id: (_normalised(data, dims) if status == Memory.Status.ACTIVE and row_model == model else None)
        for memory_id, status, row_model, data in rows
    }


def _cached(key: tuple, state: _State) -> _Matrix | None:
    """The cached matrix of `key`, unless the scope was recreated or left by a memory since."""
    matrix = _cache_get(key)
    if matrix is None or (matrix.state.scope_id, matrix.state.epoch) != (state.scope_id, state.epoch):
        return None
    if matrix.state.generation > state.generation:  # (a database restored under the process)
        return None
    return matrix


def _view(matrix: _Matrix, team_id: int, kin_key: int, model: str, state: _State) -> _View:
    """A cached matrix's view, brought up to date first (its changed rows patched in, or,
    when this transaction may roll them back, held beside it)."""
    with matrix.lock:
        if matrix.state.generation >= state.generation:  # (another thread may have patched it further)
            return _View(matrix)
        changes = _changes(team_id, kin_key, model, matrix.dims, matrix.state.generation)
        if state.committed_view:
            matrix.patch(changes, state)
            return _View(matrix)
    # Rows this transaction may roll back: scored beside the cache, never put in it.
    added = {memory_id: vector for memory_id, vector in changes.items() if vector is not None}
    if not added:
        return _View(matrix, hidden=frozenset(changes))
    return _View(matrix, hidden=frozenset(changes), extra_ids=np.fromiter(added, dtype=np.int64, count=len(added)),
                 extra_vectors=np.stack(list(added.values())))


def _views(team_id: int, kin_keys: list[int], model: str, dims: int,
           states: dict[int, _State]) -> list[_View]:
    """The scopes' views: the cached and current as they are, the cached and behind patched,
    the others read whole. Every read is on the caller's thread and connection (a test's
    transaction, or a writer's own rows, is only visible there)."""
    keys = {kin_key: _cache_key(team_id, kin_key, model, dims) for kin_key in kin_keys}
    cached = {kin_key: _cached(keys[kin_key], states[kin_key]) for kin_key in kin_keys}
    missing = [kin_key for kin_key in kin_keys if cached[kin_key] is None]
    loaded = _load(team_id, missing, model, dims, states) if missing else {}
    views = []
    for kin_key in kin_keys:
        if kin_key in loaded:
            matrix = loaded[kin_key]
            kept = states[kin_key].committed_view and _cache_put(keys[kin_key], matrix)
            views.append(_View(matrix, kept=kept))
        else:
            views.append(_view(cached[kin_key], team_id, kin_key, model, states[kin_key]))
    return views


# --- the search API ---------------------------------------------------------------------------

# The numpy work of a search runs on these threads while the caller's thread runs the
# full-text query (BLAS and psycopg both release the GIL); never a database read here.
# Created on first use, and anew in a forked child: threads do not survive a fork.
_SCAN_THREADS = 4
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _scan_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=_SCAN_THREADS, thread_name_prefix="vector-scan")
        return _executor


def _after_fork_in_child() -> None:
    # A scan thread of the parent may have held a lock at the fork: the child starts anew.
    global _executor, _executor_lock, _cache, _cache_lock
    _executor, _executor_lock = None, threading.Lock()
    _cache, _cache_lock = OrderedDict(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class PendingSimilarities:
    """Similarities being computed on a scan thread (or, with threaded False, computed
    already: nothing would overlap the scan); result() waits for them."""

    def __init__(self, views: list[_View], query: np.ndarray | None = None,
                 scan: Callable[[_View], tuple] | None = None, k: int = 0, *, threaded: bool = True):
        self._views, self._query, self._k = views, query, k
        self._future, self._found = None, {}
        if views and threaded:
            self._future = _scan_executor().submit(self._run, scan)
        elif views:
            self._found = self._run(scan)

    def _run(self, scan: Callable[[_View], tuple]) -> dict[int, float]:
        parts = []
        for view in self._views:
            with view.matrix.lock:
                parts.append(scan(view))
        ids = np.concatenate([part[0] for part in parts])
        cosines = np.concatenate([part[1] for part in parts])
        if self._k < len(ids):  # (each scope gave its k best)
            best = np.argpartition(-cosines, self._k - 1)[: self._k]
            ids, cosines = ids[best], cosines[best]
        return dict(zip(ids.tolist(), cosines.tolist(), strict=True))

    def result(self, also: set[int] | frozenset[int] = frozenset()) -> dict[int, float]:
        """The similarities found, plus those of the memories in `also` (e.g. text
        candidates) that have a vector in scope, looked up row by row."""
        found = self._future.result() if self._future is not None else self._found
        if wanted := set(also) - found.keys():
            for view in self._views:
                with view.matrix.lock:
                    found.update(view.similarities(self._query, wanted))
        return found


class FoundSimilarities(PendingSimilarities):
    """Similarities found already (through the HNSW index); result() asks `lookup` for
    those of the `also` memories not among them."""

    def __init__(self, found: dict[int, float], lookup: Callable[[set[int]], dict[int, float]]):
        super().__init__([])
        self._found, self._lookup = found, lookup

    def result(self, also: set[int] | frozenset[int] = frozenset()) -> dict[int, float]:
        if wanted := set(also) - self._found.keys():
            self._found.update(self._lookup(wanted))
        return self._found


def _query_vector(embedding: Embedding) -> np.ndarray | None:
    query = np.asarray(embedding.vector, dtype=np.float32)
    norm = float(np.linalg.norm(query))
    return query / norm if len(query) and norm else None


def _kin_keys(kin: Kin | None, include_shared: bool) -> list[int]:
    return [0] if kin is None else ([kin.pk, 0] if include_shared else [kin.pk])


def _through_index(team: Team, kin_keys: list[int], embedding: Embedding, query: np.ndarray, k: int,
                   index_rows: int | None, min_cosine: float = -1.0) -> FoundSimilarities | None:
    """The k nearest (those at min_cosine or more) through the HNSW index when the database
    has a ready one of the query's size and it serves the scope (search/hnsw.py), else None."""
    if index_rows is None:
        return None
    found = hnsw.nearest(team_id=team.pk, kin_keys=kin_keys, model=embedding.model, query=query, k=k,
                         index_rows=index_rows)
    if found is None:
        return None
    found = {memory_id: cosine for memory_id, cosine in found.items() if cosine >= min_cosine}
    return FoundSimilarities(found, lambda ids: hnsw.similarities(
        team_id=team.pk, kin_keys=kin_keys, model=embedding.model, query=query, ids=ids))


def nearest_start(*, team: Team, kin: Kin | None, include_shared: bool, embedding: Embedding,
                  k: int, threaded: bool = True) -> PendingSimilarities:
    """Start finding the `k` active memories of the scope nearest to `embedding` (a kin's
    own plus, with include_shared, the shared ones; kin=None: the shared ones only). The
    scope's rows are read now; the scan runs on a scan thread until result() (cosine by
    memory id). In pgvector mode the HNSW index answers now instead, where it serves the scope."""
    query = _query_vector(embedding)
    if query is None or k <= 0:
        return PendingSimilarities([])
    kin_keys = _kin_keys(kin, include_shared)
    states, index_rows = _read_states(team.pk, kin_keys, len(query))
    if (found := _through_index(team, kin_keys, embedding, query, k, index_rows)) is not None:
        return found
    views = _views(team.pk, kin_keys, embedding.model, len(query), states)
    return PendingSimilarities(views, query, lambda view: view.top(query, k), k=k, threaded=threaded)


def near_duplicates_start(*, team: Team, kin: Kin | None, embedding: Embedding, min_cosine: float,
                          k: int) -> PendingSimilarities:
    """Start the duplicate check: up to `k` active memories of the scope (the kin's own;
    kin=None: the shared ones) at `min_cosine` or more from `embedding`, nearest first. Bit
    codes shortlist and cosines are exact; in pgvector mode the HNSW index answers where it
    serves the scope, so no process holds a large scope's vectors for it."""
    query = _query_vector(embedding)
    if query is None or k <= 0:
        return PendingSimilarities([])
    kin_keys = _kin_keys(kin, include_shared=False)
    states, index_rows = _read_states(team.pk, kin_keys, len(query))
    if (found := _through_index(team, kin_keys, embedding, query, k, index_rows, min_cosine)) is not None:
        return found
    code = _bit_codes(query[np.newaxis])[:, 0]
    views = _views(team.pk, kin_keys, embedding.model, len(query), states)
    return PendingSimilarities(views, query, lambda view: view.near(query, code, min_cosine), k=k)


def nearest(*, team: Team, kin: Kin | None, include_shared: bool, embedding: Embedding, k: int,
            also: set[int] | frozenset[int] = frozenset()) -> dict[int, float]:
    """nearest_start(...).result(also), on this thread: there is nothing to overlap."""
    return nearest_start(team=team, kin=kin, include_shared=include_shared, embedding=embedding,
                         k=k, threaded=False).result(also)
