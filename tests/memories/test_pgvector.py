"""The pgvector mode of vector search (memories.vectorindex, memories.search.hnsw): the
ef_search rule; on PostgreSQL with pgvector (scripts/test's third pass, a pgserver) the
generated vector column, the HNSW index built by the command and used by search (EXPLAIN),
team and kin scoping, a kin with 1% of the rows still getting k results, the oldest of
many memories found by meaning, the exact path when there is no index; /healthz saying
the mode; and, without pgvector, the clean fallback to the exact mode."""
import math
import random
from datetime import timedelta
from io import StringIO

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kinsite.llm.providers import provider_override
from memories import ranking, reembed, services, tasks, vectorindex
from memories.embeddings import Embedding
from memories.models import EmbeddingRun, Memory, MemoryVector
from memories.search import hnsw, vectors
from memories.search.selectors import memory_search
from memories.services import Actor
from tests.factories import KinFactory, TeamFactory
from tests.memories.embedders import SYNONYM_DIMENSIONS, DenseSynonymEmbedder, SynonymEmbedder

pytestmark = pytest.mark.usefixtures("private_cache")

MODEL = "scripted-embedding"
DIMS = 32


# --- the ef_search rule (pure) --------------------------------------------------------------


def test_a_scope_that_is_the_whole_index_gets_the_default_ef_search_or_enough_for_k():
    assert hnsw.hnsw_ef_search(k=10, scope_rows=100_000, index_rows=100_000, min_scope=10_000) == 40
    assert hnsw.hnsw_ef_search(k=50, scope_rows=100_000, index_rows=100_000, min_scope=10_000) == 100


def test_ef_search_grows_as_the_scope_s_share_of_the_index_shrinks():
    half = hnsw.hnsw_ef_search(k=20, scope_rows=50_000, index_rows=100_000, min_scope=10_000)
    tenth = hnsw.hnsw_ef_search(k=20, scope_rows=10_000, index_rows=100_000, min_scope=10_000)
    assert (half, tenth) == (80, 400)  # k x 2 (oversampling) / share


def test_a_share_too_small_for_the_largest_ef_search_takes_the_exact_path():
    # 1% of the index: even ef_search 1000 would hold about 10 of the scope's rows, not 2 x 10.
    assert hnsw.hnsw_ef_search(k=10, scope_rows=10_000, index_rows=1_000_000, min_scope=1_000) is None
    assert hnsw.hnsw_ef_search(k=10, scope_rows=20_000, index_rows=1_000_000, min_scope=1_000) == 1000


def test_a_small_scope_takes_the_exact_path_whatever_its_share():
    assert hnsw.hnsw_ef_search(k=10, scope_rows=9_999, index_rows=9_999, min_scope=10_000) is None
    assert hnsw.hnsw_ef_search(k=10, scope_rows=5, index_rows=5, min_scope=1) is None  # fewer than k
    assert hnsw.hnsw_ef_search(k=0, scope_rows=50_000, index_rows=50_000, min_scope=1) is None


def test_an_index_count_behind_the_scope_s_counts_as_the_scope():
    # reltuples lags after inserts: the share is never taken above 1.
    assert hnsw.hnsw_ef_search(k=10, scope_rows=20_000, index_rows=5_000, min_scope=1_000) == 40


# --- without pgvector -----------------------------------------------------------------------


@pytest.mark.sqlite
def test_sqlite_is_in_the_exact_mode(db, client):
    assert vectorindex.vector_mode() == "exact"
    assert vectorindex.pgvector_enable() is False
    assert client.get("/healthz").json()["vectors"]["mode"] == "exact"


@pytest.mark.postgres
def test_postgres_without_pgvector_stays_exact_and_the_command_says_so(db, client):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is not None:
            pytest.skip("this PostgreSQL has pgvector (the test is for one without)")
    assert vectorindex.vector_mode() == "exact"
    with pytest.raises(CommandError, match="not available"):
        call_command("vector_index", "--enable", stdout=StringIO())
    assert vectorindex.vector_mode() == "exact"  # the failed CREATE EXTENSION left nothing behind
    out = StringIO()
    call_command("vector_index", stdout=out)
    assert out.getvalue() == "Vector search mode: exact\n"
    assert client.get("/healthz").json()["vectors"]["mode"] == "exact"


# --- with pgvector ---------------------------------------------------------------------------


def unit(vector) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def store(team, kin, vectors_, *, model=MODEL, content="memory {n}", status=Memory.Status.ACTIVE) -> list[int]:
    """Memories with the given vectors, bulk-written (no service, no embedder); their ids."""
    rows = Memory.objects.bulk_create(
        [Memory(team=team, kin=kin, content=content.format(n=n), embedding_model=model, status=status)
         for n in range(len(vectors_))], batch_size=1000)
    MemoryVector.objects.bulk_create(
        [MemoryVector(memory_id=row.pk, vector=ranking.vector_to_bytes(vector.tolist()))
         for row, vector in zip(rows, vectors_, strict=True)], batch_size=1000)
    return [row.pk for row in rows]


def random_vectors(rng, count, dims=DIMS) -> np.ndarray:
    vectors_ = rng.standard_normal((count, dims)).astype(np.float32)
    return vectors_ / np.linalg.norm(vectors_, axis=1, keepdims=True)


def exact_top(ids, vectors_, query, k) -> list[int]:
    cosines = vectors_ @ unit(query)
    return [ids[i] for i in np.argsort(-cosines)[:k]]


def ask(team, kin, query, *, k=10, include_shared=False, model=MODEL, also=frozenset()):
    return vectors.nearest(team=team, kin=kin, include_shared=include_shared, k=k, also=also,
                           embedding=Embedding(vector=tuple(float(x) for x in query), model=model))


def hnsw_used(queries) -> bool:
    return any("<=>" in query["sql"] for query in queries)


@pytest.fixture
def world(pgvector_db, settings):
    """Team A: a big kin (2,400 memories), a kin with 1% of the index (30), 200 shared
    memories; team B: 300 memories whose vectors copy the big kin's first 300. The HNSW
    index of the 32-d vectors is built. Scopes of 500 memories or more use it."""
    settings.MEMORY_VECTOR_HNSW_MIN_SCOPE = 500
    rng = np.random.default_rng(17)
    team_a, team_b = TeamFactory(), TeamFactory()
    big, small, other = KinFactory(team=team_a), KinFactory(team=team_a), KinFactory(team=team_b)
    big_vectors, small_vectors, shared_vectors = (random_vectors(rng, n) for n in (2400, 30, 200))
    world = {
        "rng": rng, "team_a": team_a, "team_b": team_b, "big": big, "small": small, "other": other,
        "big_ids": store(team_a, big, big_vectors), "big_vectors": big_vectors,
        "small_ids": store(team_a, small, small_vectors), "small_vectors": small_vectors,
        "shared_ids": store(team_a, None, shared_vectors), "shared_vectors": shared_vectors,
        "other_ids": store(team_b, other, big_vectors[:300]),
    }
    assert vectorindex.hnsw_index_build(DIMS) == "built"
    return world


def test_the_generated_column_holds_the_stored_float32_vector_whatever_wrote_it(pgvector_db, team, kin):
    values = [0.5, -0.25, 1e-40, -3.0e38, 0.0, 1 / 3]  # a subnormal, a huge one, a repeating fraction
    [memory_id] = store(team, kin, [np.asarray(values, dtype=np.float32)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT embedding::real[] FROM memories_memoryvector WHERE memory_id = %s", [memory_id])
        stored = np.asarray(cursor.fetchone()[0], dtype=np.float32)
        assert stored.tolist() == np.asarray(values, dtype=np.float32).tolist()  # bit for bit
        # A raw write (no Django) regenerates it too.
        cursor.execute("UPDATE memories_memoryvector SET vector = %s WHERE memory_id = %s",
                       [ranking.vector_to_bytes([2.0, -4.0]), memory_id])
        cursor.execute("SELECT embedding::real[] FROM memories_memoryvector WHERE memory_id = %s", [memory_id])
        assert cursor.fetchone()[0] == [2.0, -4.0]
        # Stored inline first (MAIN): the HNSW path reads it for every candidate.
        cursor.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = 'memories_memoryvector'::regclass"
                       " AND attname = 'embedding'")
        assert cursor.fetchone()[0] == "m"


def test_search_uses_the_hnsw_index_for_a_big_kin(world):
    big, query = world["big"], world["big_vectors"][7] + 0.05 * world["rng"].standard_normal(DIMS)
    kin_keys = [big.pk]
    sql = hnsw.hnsw_query_sql(dims=DIMS, kin_keys=kin_keys)
    params = hnsw.hnsw_query_params(query=unit(query), ef_search=40, team_id=world["team_a"].pk,
                                    kin_keys=kin_keys, model=MODEL, k=10)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Index Scan using {vectorindex.hnsw_index_name(DIMS)}" in plan
    with CaptureQueriesContext(connection) as queries:
        found = ask(world["team_a"], big, query, k=10)
    assert hnsw_used(queries.captured_queries)
    expected = exact_top(world["big_ids"], world["big_vectors"], query, 10)
    assert len(found) == 10 and world["big_ids"][7] == max(found, key=found.get)
    assert len(set(found) & set(expected)) >= 8  # approximate, but close to the exact answer
    exact = world["big_vectors"][world["big_ids"].index(expected[0])] @ unit(query)
    assert found[expected[0]] == pytest.approx(float(exact), abs=1e-5)  # the same cosine as the exact path


def test_search_never_crosses_teams_or_kins_and_adds_shared_memories_when_asked(world):
    big, query = world["big"], world["big_vectors"][3]
    own = ask(world["team_a"], big, query, k=40)
    assert set(own) <= set(world["big_ids"])  # team B's copies of the same vectors never come back
    other = ask(world["team_b"], world["other"], query, k=5)
    assert set(other) <= set(world["other_ids"]) and max(other, key=other.get) == world["other_ids"][3]
    shared_query = world["shared_vectors"][9]
    with CaptureQueriesContext(connection) as queries:
        mixed = ask(world["team_a"], big, shared_query, k=20, include_shared=True)
    assert hnsw_used(queries.captured_queries)
    assert set(mixed) <= set(world["big_ids"]) | set(world["shared_ids"])
    assert max(mixed, key=mixed.get) == world["shared_ids"][9]
    assert world["shared_ids"][9] not in ask(world["team_a"], big, shared_query, k=20)


def test_a_kin_holding_one_percent_of_the_index_still_gets_k_results(world, settings):
    small, query = world["small"], world["small_vectors"][0] + 0.3 * world["rng"].standard_normal(DIMS)
    kin_keys = [small.pk]
    # The trap: HNSW filters after the index scan, so at the default ef_search the kin's rows
    # are mostly not among the whole index's 40 nearest.
    with connection.cursor() as cursor:
        cursor.execute(hnsw.hnsw_query_sql(dims=DIMS, kin_keys=kin_keys),
                       hnsw.hnsw_query_params(query=unit(query), ef_search=40, team_id=world["team_a"].pk,
                                              kin_keys=kin_keys, model=MODEL, k=10))
        assert len(cursor.fetchall()) < 10
    settings.MEMORY_VECTOR_HNSW_MIN_SCOPE = 10  # only the share rule decides now
    found = ask(world["team_a"], small, query, k=10)
    assert sorted(found) == sorted(exact_top(world["small_ids"], world["small_vectors"], query, 10))


def test_the_oldest_of_many_memories_is_found_by_meaning_through_the_index(pgvector_db, team, kin, settings):
    """Acceptance 1 in the pgvector mode, at 3,000 memories (the benchmark runs 100,000)."""
    settings.MEMORY_VECTOR_HNSW_MIN_SCOPE = 500
    actor = Actor(label="test")
    embedder = DenseSynonymEmbedder()
    rng = random.Random(5)
    vocabulary = [f"{stem}{n}" for stem in ("ticket", "invoice", "ledger", "batch", "report") for n in range(200)]
    newer = [" ".join(rng.sample(vocabulary, 6)) for _ in range(3000)]
    with provider_override(embedder):
        parked = services.memory_add(team=team, kin=kin, content="The automobile is parked downstairs",
                                     actor=actor).memory
        Memory.objects.filter(pk=parked.pk).update(updated_at=timezone.now() - timedelta(days=400))
        store(team, kin, [np.asarray(embedder.vector(text), dtype=np.float32) for text in newer],
              model=parked.embedding_model, content="{n}")
        assert Memory.objects.filter(kin=kin).count() == 3001
        call_command("vector_index", "--build", stdout=StringIO())
        with CaptureQueriesContext(connection) as queries:
            hits = memory_search(team=team, kin=kin, query="where is my car", limit=10)
        assert hnsw_used(queries.captured_queries)
        assert hits[0].memory == parked and hits[0].components["text"] == 0
        # The duplicate check of a write goes through the index too, and finds it by meaning.
        with CaptureQueriesContext(connection) as queries:
            result = services.memory_add(team=team, kin=kin, content="The vehicle is parked downstairs", actor=actor)
        assert hnsw_used(queries.captured_queries)
    assert not result.created and result.memory.pk == parked.pk


def test_without_the_index_search_takes_the_exact_path_and_stays_right(world):
    big, query = world["big"], world["big_vectors"][11]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {vectorindex.hnsw_index_name(DIMS)}")
    with CaptureQueriesContext(connection) as queries:
        found = ask(world["team_a"], big, query, k=10)
    assert not hnsw_used(queries.captured_queries)
    assert sorted(found) == sorted(exact_top(world["big_ids"], world["big_vectors"], query, 10))


def test_text_candidates_get_their_similarity_from_the_index_path_too(world):
    big, query = world["big"], world["big_vectors"][0]
    far = min(range(len(world["big_ids"])), key=lambda i: float(world["big_vectors"][i] @ query))
    far_id, shared_id, other_team_id = world["big_ids"][far], world["shared_ids"][0], world["other_ids"][0]
    with CaptureQueriesContext(connection) as queries:
        found = ask(world["team_a"], big, query, k=5, also={far_id, shared_id, other_team_id})
    assert hnsw_used(queries.captured_queries)
    assert found[far_id] == pytest.approx(float(world["big_vectors"][far] @ query), abs=1e-5)
    assert shared_id not in found and other_team_id not in found  # out of scope: no similarity
    assert len(found) == 6


def test_models_are_never_mixed_through_the_index(world):
    big, query = world["big"], world["big_vectors"][5]
    Memory.objects.filter(pk=world["big_ids"][5]).update(embedding_model="another-model")
    found = ask(world["team_a"], big, query, k=10)
    assert world["big_ids"][5] not in found and len(found) == 10
    assert list(ask(world["team_a"], big, query, k=10, model="another-model")) == [world["big_ids"][5]]


def test_healthz_and_the_command_say_the_mode_and_the_index_state(pgvector_db, client, team, kin, settings):
    with provider_override(SynonymEmbedder()):
        assert client.get("/healthz").json()["vectors"]["mode"] == "pgvector"
        assert client.get("/healthz").json()["vectors"]["index"] is None  # no vector of the model yet
        services.memory_add(team=team, kin=kin, content="Maria prefers espresso", actor=Actor(label="test"))
        name = vectorindex.hnsw_index_name(SYNONYM_DIMENSIONS)
        assert client.get("/healthz").json()["vectors"]["index"] == {
            "name": name, "dims": SYNONYM_DIMENSIONS, "state": "missing", "rows": 0}
        out = StringIO()
        call_command("vector_index", "--build", stdout=out)
        assert out.getvalue().endswith(f"Built.\nVector search mode: pgvector\nHNSW index {name} "
                                       f"({SYNONYM_DIMENSIONS} dimensions, model {MODEL}): ready, 1 rows\n")
        assert client.get("/healthz").json()["vectors"]["index"]["state"] == "ready"


def test_a_build_that_died_is_reported_failed_and_replaced_by_the_next_build(pgvector_db, team, kin):
    store(team, kin, random_vectors(np.random.default_rng(1), 50))
    name = vectorindex.hnsw_index_name(DIMS)
    with connection.cursor() as cursor:  # what a CREATE INDEX CONCURRENTLY that died leaves behind
        cursor.execute(f"CREATE INDEX {name} ON memories_memoryvector USING hnsw"
                       f" (({vectorindex.hnsw_expression(DIMS)}) vector_cosine_ops)"
                       f" WHERE {vectorindex.hnsw_predicate(DIMS)}")
        cursor.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", [name])
    assert vectorindex.hnsw_index_state(DIMS) == ("failed", 0)
    assert vectorindex.hnsw_index_build(DIMS) == "built"
    state, rows = vectorindex.hnsw_index_state(DIMS)
    assert state == "ready" and math.isclose(rows, 50, abs_tol=1)


def test_beat_builds_the_index_once_re_embedding_is_done(pgvector_db, team, kin):
    embedder = SynonymEmbedder()
    with provider_override(embedder):
        assert reembed.vector_index_check() is None  # no vector of the model yet
        services.memory_add(team=team, kin=kin, content="Maria prefers espresso", actor=Actor(label="test"))
        run = EmbeddingRun.objects.create(model=MODEL, status=EmbeddingRun.Status.RUNNING)
        assert reembed.vector_index_check() is None  # a run for the model is going: not yet
        assert vectorindex.hnsw_index_state(SYNONYM_DIMENSIONS)[0] == "missing"
        EmbeddingRun.objects.filter(pk=run.pk).update(status=EmbeddingRun.Status.DONE)
        assert tasks.vector_index_check_task.delay().get() == "built"
        assert vectorindex.hnsw_index_state(SYNONYM_DIMENSIONS)[0] == "ready"
        assert reembed.vector_index_check() is None  # ready: nothing to do
