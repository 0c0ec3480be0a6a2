"""A scope's vectors in memory (memories.search.vectors): the float32 matrix a process
caches and patches, the bit codes of the duplicate check's prefilter, one search's view."""
import math
import threading
from dataclasses import dataclass

import numpy as np

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
    rows past `size` are spare, rows with alive False were dropped. `codes` are the rows'
    bit codes for the duplicate check (see _bit_codes), built on its first use."""

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
        self.codes: np.ndarray | None = None
        self.row_of = {memory_id: row for row, memory_id in enumerate(ids)}
        self.dropped = 0
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        codes = 0 if self.codes is None else self.codes.nbytes
        return self.vectors.nbytes + self.ids.nbytes + self.alive.nbytes + codes

    def patch(self, changes: dict[int, np.ndarray | None], state: _State) -> None:
        """Apply changed rows (a normalised vector, or None: no longer in this matrix)."""
        written = []
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
            written.append(row)
        if written and self.codes is not None:
            self.codes[:, written] = _bit_codes(self.vectors[written])
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
        if self.codes is not None:  # (one column per row)
            codes = np.zeros((self.codes.shape[0], capacity), dtype=self.codes.dtype)
            codes[:, : self.size] = self.codes[:, : self.size]
            self.codes = codes

    def _compact(self) -> None:
        keep = np.flatnonzero(self.alive[: self.size])
        ids, vectors, lock = self.ids[keep], self.vectors[keep], self.lock
        self.__init__(dims=self.dims, state=self.state, ids=ids.tolist(), vectors=vectors)
        self.lock = lock

    def ensure_codes(self) -> np.ndarray:
        if self.codes is None:
            codes = np.zeros((_CODE_WORDS, len(self.ids)), dtype=np.uint64)
            for start in range(0, self.size, _CODE_CHUNK):
                stop = min(start + _CODE_CHUNK, self.size)
                codes[:, start:stop] = _bit_codes(self.vectors[start:stop])
            self.codes = codes
        return self.codes


# --- bit codes: the duplicate check's prefilter ------------------------------------------------

# The duplicate check wants only vectors at DUPLICATE_MIN_COSINE (0.93) or more, so it
# compares CODE_BITS-bit SimHash codes (the signs of projections on fixed random directions,
# so a bit differs with probability angle/π whatever the embedding) by Hamming distance,
# then the exact cosines of the DUPLICATE_SHORTLIST rows nearest by code. Near misses
# (templated memories, a log line a day) can crowd a duplicate out of the shortlist, so when
# all of it is within DUPLICATE_CODE_SIGMAS deviations of a threshold row's expected
# distance, every row within that is compared: a duplicate at 0.93 is then missed with
# probability 5e-5. More deviations reach thousands of rows on a small vocabulary, costing
# more than the scan saves.
CODE_BITS = 256
DUPLICATE_SHORTLIST = 256
DUPLICATE_CODE_SIGMAS = 4
_CODE_WORDS = CODE_BITS // 64
# Rows projected at a time when a matrix's codes are built (bounds the temporary array).
_CODE_CHUNK = 8192
_directions: dict[int, np.ndarray] = {}


def _bit_codes(vectors: np.ndarray) -> np.ndarray:
    """The codes of (n, dims) vectors, as (CODE_WORDS, n) uint64: word w of every row is
    contiguous, so the Hamming distances are computed a word at a time over all rows."""
    dims = vectors.shape[1]
    directions = _directions.get(dims)
    if directions is None:
        # Fixed seed: every process (and every matrix) projects on the same directions.
        directions = np.random.default_rng(dims).standard_normal((dims, CODE_BITS), dtype=np.float32)
        _directions[dims] = directions
    bits = np.packbits(vectors @ directions > 0, axis=1)  # (n, CODE_BITS / 8) uint8
    return np.ascontiguousarray(bits.view(np.uint64).T)


def _code_reach(min_cosine: float) -> int:
    """The code distance within which a row at `min_cosine` or more falls but for
    DUPLICATE_CODE_SIGMAS standard deviations: its differing bits are Binomial(CODE_BITS,
    angle/π)."""
    p = math.acos(min(max(min_cosine, -1.0), 1.0)) / math.pi
    return math.ceil(CODE_BITS * p + DUPLICATE_CODE_SIGMAS * math.sqrt(CODE_BITS * p * (1 - p)))


def _hamming(codes: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Bits differing between each column of `codes` and `code` (one column), as uint16."""
    distance = np.bitwise_count(codes[0] ^ code[0]).astype(np.uint16)
    for word in range(1, len(codes)):
        distance += np.bitwise_count(codes[word] ^ code[word])
    return distance


# --- one search's view of a scope ---------------------------------------------------------------


@dataclass(frozen=True)
class _View:
    """A scope's vectors as this connection sees them: the matrix, but for the rows this
    connection's own transaction changed (`hidden`, by memory id), which it holds outside
    the cached matrix (`extra_ids`, `extra_vectors`). Its methods run under the matrix lock."""

    matrix: _Matrix
    # False: the matrix was read for this query alone (not cached).
    kept: bool = True
    hidden: frozenset[int] = frozenset()
    extra_ids: np.ndarray | None = None
    extra_vectors: np.ndarray | None = None

    def _hidden_rows(self) -> list[int]:
        return [row for row in map(self.matrix.row_of.get, self.hidden) if row is not None]

    def _with_extra(self, ids: np.ndarray, cosines: np.ndarray, query: np.ndarray,
                    min_cosine: float = -np.inf) -> tuple[np.ndarray, np.ndarray]:
        if self.extra_vectors is None:
            return ids, cosines
        extra = self.extra_vectors @ query
        keep = extra >= min_cosine
        return np.concatenate([ids, self.extra_ids[keep]]), np.concatenate([cosines, extra[keep]])

    def top(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, cosines) of the k nearest rows (and every extra row). The product runs over
        the matrix in place (selecting the live rows first would copy it); dead rows get -inf."""
        matrix = self.matrix
        cosines = matrix.vectors[: matrix.size] @ query
        if matrix.dropped:
            cosines[~matrix.alive[: matrix.size]] = -np.inf
        cosines[self._hidden_rows()] = -np.inf
        # The k smallest of the negated cosines: introselect with kth near the end is far
        # slower on tied values.
        rows = np.argpartition(-cosines, k - 1)[:k] if k < len(cosines) else np.arange(len(cosines))
        rows = rows[cosines[rows] > -np.inf]
        return self._with_extra(matrix.ids[rows], cosines[rows], query)

    def near(self, query: np.ndarray, code: np.ndarray, min_cosine: float) -> tuple[np.ndarray, np.ndarray]:
        """(ids, cosines) of the rows at min_cosine or more among the DUPLICATE_SHORTLIST
        nearest by bit code (more when more are within a duplicate's reach: see CODE_BITS),
        and of the extra rows (all compared exactly)."""
        matrix = self.matrix
        if self.kept or matrix.codes is not None:
            distance = _hamming(matrix.ensure_codes()[:, : matrix.size], code)
            far = np.iinfo(distance.dtype).max
            if matrix.dropped:
                distance[~matrix.alive[: matrix.size]] = far
            distance[self._hidden_rows()] = far
            if len(distance) > DUPLICATE_SHORTLIST:
                rows = np.argpartition(distance, DUPLICATE_SHORTLIST - 1)[:DUPLICATE_SHORTLIST]
                if distance[rows].max() <= (reach := _code_reach(min_cosine)):
                    # Rows beyond the shortlist may be duplicates too (see CODE_BITS): all of them.
                    rows = np.flatnonzero(distance <= reach)
            else:
                rows = np.arange(len(distance))
            rows = rows[distance[rows] < far]
            cosines = matrix.vectors[rows] @ query
        else:
            # A matrix read for this query alone: building its codes would cost more than
            # the exact scan.
            cosines = matrix.vectors[: matrix.size] @ query
            if matrix.dropped:
                cosines[~matrix.alive[: matrix.size]] = -np.inf
            cosines[self._hidden_rows()] = -np.inf
            rows = np.arange(matrix.size)
        keep = cosines >= min_cosine
        return self._with_extra(matrix.ids[rows[keep]], cosines[keep], query, min_cosine)

    def similarities(self, query: np.ndarray, wanted: set[int]) -> dict[int, float]:
        """The cosines of the memories in `wanted` this scope holds, row by row."""
        matrix = self.matrix
        rows = [row for memory_id in wanted - self.hidden
                if (row := matrix.row_of.get(memory_id)) is not None and matrix.alive[row]]
        found = dict(zip(matrix.ids[rows].tolist(), (matrix.vectors[rows] @ query).tolist(), strict=True))
        if self.extra_vectors is not None:
            extra = [i for i, memory_id in enumerate(self.extra_ids.tolist()) if memory_id in wanted]
            found.update(zip(self.extra_ids[extra].tolist(), (self.extra_vectors[extra] @ query).tolist(),
                             strict=True))
        return found
