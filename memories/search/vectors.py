"""The vector side of memory search: an exact nearest-neighbour scan over every stored
vector of a scope (no recency cap), as a float32 numpy matrix. In the pgvector mode
(memories.vectorindex) large scopes go through the HNSW index instead (search/hnsw.py),
and every scope the index cannot serve well comes here.

A scope is a kin's own memories or its team's shared ones (a search with include_shared
scans both). Only active memories whose vector the query's model made, with the query's
dimensions, are scanned: models are never mixed.

Each process (web worker, Celery worker) keeps the matrices it has built in an LRU capped
by settings.MEMORY_VECTOR_CACHE_MB (a scope larger than the cap is read whole at every
search). Before each use it reads the scopes' rows of MemoryVectorScope (one query over
a unique index): database triggers bump a scope's generation in the
transaction of every write that changes a memory's vector (its MemoryVector row), model,
status, kin or team, and stamp the memory's vector_seq with it (migrations 0006, 0008),
whatever wrote it (services, bulk writes, the admin, raw SQL). A newer generation costs a fetch of the rows stamped
after the cached one, patched into the matrix; a newer epoch (a memory left the scope)
or another scope row (the scope was recreated) a reload. A reader whose own transaction
has written (so it may see uncommitted rows that could roll back; on SQLite, any reader
inside a transaction block) uses what it reads for its query but never stores it in the
cache."""
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connection

from kinsite.models import Kin, Team
from memories import vectorindex
from memories.embeddings import Embedding
from memories.models import Memory, MemoryVector, MemoryVectorScope
from memories.search import hnsw

_SCOPE_TABLE = MemoryVectorScope._meta.db_table
_MEMORY_TABLE = Memory._meta.db_table
_VECTOR_TABLE = MemoryVector._meta.db_table
# Spare rows allocated when a matrix grows, so adding a memory rarely copies the matrix.
_GROWTH = 0.125
_MIN_SPARE = 64
# A matrix is rebuilt without its dropped rows once they are this share of it.
_COMPACT_SHARE = 0.2


@dataclass(frozen=True)
class _State:
    """What the scope's MemoryVectorScope row said (all 0 when it has none yet), and
    whether this connection sees only committed rows (so what it reads may be cached)."""

    scope_id: int
    generation: int
    epoch: int
    committed_view: bool


class _Matrix:
    """One scope's vectors of one model and size: row i holds memory ids[i], normalised;
    rows past `size` are spare, rows with alive False were dropped."""

    def __init__(self, *, dims: int, state: _State, ids: list[int], vectors: np.ndarray):
        self.dims = dims
        self.state = state
        self.size = len(ids)
        capacity = self.size + max(_MIN_SPARE, int(self.size * _GROWTH))
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.ids[: self.size] = ids
        self.vectors = np.zeros((capacity, dims), dtype=np.float32)
        self.vectors[: self.size] = vectors
        self.alive = np.zeros(capacity, dtype=bool)
        self.alive[: self.size] = True
        self.row_of = {memory_id: row for row, memory_id in enumerate(ids)}
        self.dropped = 0
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + self.ids.nbytes + self.alive.nbytes

    def patch(self, changes: dict[int, np.ndarray | None], state: _State) -> None:
        """Apply changed rows (a normalised vector, or None: no longer in this matrix)."""
        for memory_id, vector in changes.items():
            row = self.row_of.get(memory_id)
            if vector is None:
                if row is not None and self.alive[row]:
                    self.alive[row] = False
                    self.dropped += 1
                continue
            if row is None:
                if self.size == len(self.ids):
                    self._grow()
                row = self.size
                self.size += 1
                self.ids[row] = memory_id
                self.row_of[memory_id] = row
            elif not self.alive[row]:
                self.dropped -= 1
            self.vectors[row] = vector
            self.alive[row] = True
        if self.dropped > _COMPACT_SHARE * max(self.size, 1):
            self._compact()
        if state.generation > self.state.generation:
            self.state = state

    def _grow(self) -> None:
        capacity = self.size + max(_MIN_SPARE, int(self.size * _GROWTH))
        for name in ("ids", "vectors", "alive"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)

    def _compact(self) -> None:
        keep = np.flatnonzero(self.alive[: self.size])
        ids, vectors, lock = self.ids[keep], self.vectors[keep], self.lock
        self.__init__(dims=self.dims, state=self.state, ids=ids.tolist(), vectors=vectors)
        self.lock = lock

    def scores(self, query: np.ndarray, hidden: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, cosines) of the live rows but those in `hidden`. The product runs over the
        matrix in place (selecting the live rows first would copy it)."""
        cosines = self.vectors[: self.size] @ query
        if not self.dropped and not hidden:
            return self.ids[: self.size].copy(), cosines
        live = self.alive[: self.size].copy()
        for memory_id in hidden:
            row = self.row_of.get(memory_id)
            if row is not None:
                live[row] = False
        return self.ids[: self.size][live], cosines[live]


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


def _cache_put(key: tuple, matrix: _Matrix) -> None:
    cap = settings.MEMORY_VECTOR_CACHE_MB * 1024 * 1024
    with _cache_lock:
        _cache.pop(key, None)
        if matrix.nbytes > cap:
            return
        _cache[key] = matrix
        total = sum(m.nbytes for m in _cache.values())
        while total > cap:
            _, evicted = _cache.popitem(last=False)
            total -= evicted.nbytes


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
    """The scopes' MemoryVectorScope rows, in one query; on PostgreSQL the same query also
    says whether a valid HNSW index of `dims`-sized vectors exists (pgvector mode,
    memories.vectorindex) and how many rows it holds by the planner's count: (states,
    that count, or None without such an index). So the exact path costs no extra query
    for asking, on any database."""
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
    scopes = []
    params: list = [team_id]
    if own := [kin_key for kin_key in kin_keys if kin_key]:
        scopes.append(f"m.kin_id IN ({', '.join(['%s'] * len(own))})")
        params += own
    if 0 in kin_keys:
        scopes.append("m.kin_id IS NULL")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(m.kin_id, 0), m.id, v.vector FROM {_MEMORY_TABLE} m"
            f" JOIN {_VECTOR_TABLE} v ON v.memory_id = m.id"
            f" WHERE m.team_id = %s AND ({' OR '.join(scopes)}) AND m.status = %s AND m.embedding_model = %s",
            [*params, Memory.Status.ACTIVE, model],
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


def _scores(matrix: _Matrix, team_id: int, kin_key: int, model: str, query: np.ndarray,
            state: _State) -> tuple[np.ndarray, np.ndarray]:
    """(ids, cosines) over a cached matrix, brought up to date first."""
    with matrix.lock:
        if matrix.state.generation >= state.generation:  # (another thread may have patched it further)
            return matrix.scores(query, hidden=set())
        changes = _changes(team_id, kin_key, model, matrix.dims, matrix.state.generation)
        if state.committed_view:
            matrix.patch(changes, state)
            return matrix.scores(query, hidden=set())
        # Rows this transaction may roll back: scored beside the cache, never put in it.
        ids, cosines = matrix.scores(query, hidden=set(changes))
    added = [(memory_id, vector) for memory_id, vector in changes.items() if vector is not None]
    if not added:
        return ids, cosines
    added_ids = np.array([memory_id for memory_id, _ in added], dtype=np.int64)
    added_cosines = np.stack([vector for _, vector in added]) @ query
    return np.concatenate([ids, added_ids]), np.concatenate([cosines, added_cosines])


def _all_scores(team_id: int, kin_keys: list[int], model: str, query: np.ndarray,
                states: dict[int, _State]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, cosines) over the scopes, given their states (_read_states): nothing more to
    read for the ones cached and current, the changed rows of the ones cached and behind, and one read
    of every vector for the others."""
    dims = len(query)
    keys = {kin_key: _cache_key(team_id, kin_key, model, dims) for kin_key in kin_keys}
    cached = {kin_key: _cached(keys[kin_key], states[kin_key]) for kin_key in kin_keys}
    missing = [kin_key for kin_key in kin_keys if cached[kin_key] is None]
    loaded = _load(team_id, missing, model, dims, states) if missing else {}
    parts = []
    for kin_key in kin_keys:
        if kin_key in loaded:
            matrix = loaded[kin_key]
            if states[kin_key].committed_view:
                _cache_put(keys[kin_key], matrix)
            with matrix.lock:
                parts.append(matrix.scores(query, hidden=set()))
        else:
            parts.append(_scores(cached[kin_key], team_id, kin_key, model, query, states[kin_key]))
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])


# --- the search API ---------------------------------------------------------------------------


def nearest(*, team: Team, kin: Kin | None, include_shared: bool, embedding: Embedding, k: int,
            also: set[int] | frozenset[int] = frozenset()) -> dict[int, float]:
    """Cosine similarity by memory id of the `k` active memories of the scope nearest to
    `embedding` (a kin's own plus, with include_shared, the team-shared ones; kin=None:
    the shared ones only), among every vector of the scope the same model made; plus the
    similarity of the memories in `also` (e.g. text candidates) that have such a vector.
    Through the HNSW index (approximate) when the database has one for the query's size
    and the scope is large enough a share of it (search/hnsw.py); else the exact scan."""
    query = np.asarray(embedding.vector, dtype=np.float32)
    norm = float(np.linalg.norm(query))
    if not len(query) or not norm:
        return {}
    query /= norm
    kin_keys = [0] if kin is None else ([kin.pk, 0] if include_shared else [kin.pk])
    states, index_rows = _read_states(team.pk, kin_keys, len(query))
    if index_rows is not None:
        found = hnsw.nearest(team_id=team.pk, kin_keys=kin_keys, model=embedding.model, query=query, k=k,
                             also=also, index_rows=index_rows)
        if found is not None:
            return found
    ids, cosines = _all_scores(team.pk, kin_keys, embedding.model, query, states)
    if not len(ids):
        return {}
    if k <= 0:
        top = np.empty(0, dtype=np.int64)
    elif k < len(ids):
        top = np.argpartition(-cosines, k - 1)[:k]
    else:
        top = np.arange(len(ids))
    result = {int(ids[i]): float(cosines[i]) for i in top}
    if also:
        wanted = np.flatnonzero(np.isin(ids, np.fromiter(also, dtype=np.int64, count=len(also))))
        result.update((int(ids[i]), float(cosines[i])) for i in wanted)
    return result
