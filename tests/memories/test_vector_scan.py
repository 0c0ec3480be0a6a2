"""Vector search without pgvector (memories.search.vectors): every vector of the scope is
scanned, however many newer memories there are; models and scopes are never mixed; and
each process's cached matrices follow writes made by any path, in any process, once
committed (never a write that rolled back)."""
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection, transaction
from django.utils import timezone

from kinsite.llm.providers import provider_override
from memories import ranking, services
from memories.embeddings import Embedding
from memories.models import Memory, MemoryVector
from memories.search import vector_matrix, vectors
from memories.search.selectors import memory_find_duplicate, memory_search
from memories.services import Actor
from tests.factories import KinFactory
from tests.memories.embedders import SynonymEmbedder
from tests.support.scripted_model import ScriptedProvider, hashed_bag_of_words

pytestmark = pytest.mark.usefixtures("private_cache")

MODEL = "scripted-embedding"
NEWER = 5_000


def add(team, kin, content, **kwargs):
    return services.memory_add(team=team, kin=kin, content=content, actor=Actor(label="test"), **kwargs)


def vector_row(team, kin, content, *, model=MODEL, vector=None, status=Memory.Status.ACTIVE):
    """An unsaved memory made by `model`, its vector (bytes) carried in `test_vector` for create()."""
    vector = hashed_bag_of_words(content) if vector is None else vector
    memory = Memory(team=team, kin=kin, content=content, status=status, embedding_model=model)
    memory.test_vector = ranking.vector_to_bytes(vector)
    return memory


def create(rows, batch_size=None):
    """The vector_row memories, then their vectors: two bulk writes, bypassing the services."""
    Memory.objects.bulk_create(rows, batch_size=batch_size)
    MemoryVector.objects.bulk_create([MemoryVector(memory_id=row.pk, vector=row.test_vector) for row in rows],
                                     batch_size=batch_size)
    return rows


def stored_vector(memory_id):
    return ranking.vector_from_bytes(MemoryVector.objects.get(memory_id=memory_id).vector)


def bury(team, kin, oldest, count=NEWER):
    """`count` newer memories with vectors, none sharing a word with the tests' queries."""
    Memory.objects.filter(pk=oldest.pk).update(updated_at=timezone.now() - timedelta(days=400))
    create(
        [vector_row(team, kin, f"Ticket t{n} about invoice batch b{n % 97} in the ledger") for n in range(count)],
        batch_size=1000,
    )


def query(text, model=MODEL):
    return Embedding(vector=tuple(hashed_bag_of_words(text)), model=model)


def nearest(team, kin, text, *, include_shared=True, k=5, **kwargs):
    return vectors.nearest(team=team, kin=kin, include_shared=include_shared, embedding=query(text, **kwargs), k=k)


# --- no recency cap -------------------------------------------------------------------------


def test_memory_found_only_by_meaning_under_thousands_of_newer_ones(team, kin):
    with provider_override(SynonymEmbedder()):
        parked = add(team, kin, "The automobile is parked downstairs").memory
        bury(team, kin, parked)
        assert Memory.objects.filter(kin=kin, vector__isnull=False).count() == NEWER + 1
        hits = memory_search(team=team, kin=kin, query="where is my car", limit=10)
    assert [hit.memory for hit in hits] == [parked]
    assert hits[0].components["text"] == 0 and hits[0].components["vector"] > 0


def test_duplicate_found_by_meaning_under_thousands_of_newer_ones(team, kin):
    with provider_override(SynonymEmbedder()):
        original = add(team, kin, "Maria prefers short answers").memory
        bury(team, kin, original)
        result = add(team, kin, "Maria likes concise replies")
    assert not result.created and result.memory.pk == original.pk
    assert Memory.objects.get(pk=original.pk).content == "Maria likes concise replies"


def test_text_candidates_carry_their_similarity_beyond_the_nearest(team, kin):
    [far] = create([vector_row(team, kin, "budget ledger audit")])
    create([vector_row(team, kin, f"espresso number n{n}") for n in range(20)])
    scores = vectors.nearest(team=team, kin=kin, include_shared=True, embedding=query("espresso"), k=3,
                             also={far.pk})
    assert len(scores) == 4 and far.pk in scores
    assert scores[far.pk] == pytest.approx(0.0, abs=1e-6)
    assert all(s > 0.4 for i, s in scores.items() if i != far.pk)


# --- models, dimensions and scopes ------------------------------------------------------------


def test_models_and_dimensions_are_never_mixed(team, kin):
    same = vector_row(team, kin, "coffee beans grinder")
    other_model = vector_row(team, kin, "coffee beans grinder", model="other-embedding")
    other_dims = vector_row(team, kin, "coffee beans grinder", vector=[0.5] * 32)
    create([same, other_model, other_dims])
    assert set(nearest(team, kin, "coffee beans grinder", k=10)) == {same.pk}
    assert set(nearest(team, kin, "coffee beans grinder", k=10, model="other-embedding")) == {other_model.pk}


def test_scopes_hold_team_kin_and_shared(team, kin, other_team):
    sibling = KinFactory(team=team)
    stranger = KinFactory(team=other_team)
    text = "coffee beans grinder"
    rows = {
        "own": vector_row(team, kin, text), "shared": vector_row(team, None, text),
        "sibling": vector_row(team, sibling, text), "other team": vector_row(other_team, stranger, text),
        "other team shared": vector_row(other_team, None, text),
        "deleted": vector_row(team, kin, text, status=Memory.Status.DELETED),
    }
    create(rows.values())
    ids = {name: row.pk for name, row in rows.items()}
    assert set(nearest(team, kin, text, k=50)) == {ids["own"], ids["shared"]}
    assert set(nearest(team, kin, text, k=50, include_shared=False)) == {ids["own"]}
    assert set(nearest(team, None, text, k=50)) == {ids["shared"]}
    # A kin passed with the wrong team finds nothing of either.
    assert set(nearest(other_team, kin, text, k=50, include_shared=False)) == set()


def test_k_nearest_are_the_most_similar(team, kin):
    create([vector_row(team, kin, " ".join(f"w{i}" for i in range(n + 1))) for n in range(30)])
    scores = nearest(team, kin, "w0 w1 w2", k=3)
    assert len(scores) == 3
    exact = {m.pk: ranking.cosine(hashed_bag_of_words("w0 w1 w2"), stored_vector(m.pk))
             for m in Memory.objects.filter(kin=kin)}
    best = sorted(exact, key=lambda i: -exact[i])[:3]
    assert set(scores) == set(best)
    for memory_id, score in scores.items():
        assert score == pytest.approx(exact[memory_id], abs=1e-5)


# --- the cache follows every write, in every process ---------------------------------------------


def count_loads(monkeypatch):
    loads = []
    real = vectors._load

    def load(team_id, kin_keys, *args):
        loads.extend((team_id, kin_key) for kin_key in kin_keys)
        return real(team_id, kin_keys, *args)

    monkeypatch.setattr(vectors, "_load", load)
    return loads


@pytest.mark.django_db(transaction=True)
def test_cache_follows_writes_made_elsewhere(team, kin, monkeypatch):
    """Every write below bypasses this process's cache (bulk, QuerySet.update, raw SQL,
    a move, a delete), as another process's write would: the cache sees each one."""
    loads = count_loads(monkeypatch)
    create([vector_row(team, kin, f"filler note n{n}") for n in range(10)])
    target = "coffee beans grinder"
    assert nearest(team, kin, target, include_shared=False) and len(loads) == 1
    assert vectors.vector_cache_bytes() > 0

    [added] = create([vector_row(team, kin, target)])
    assert max(nearest(team, kin, target, include_shared=False).items(), key=lambda x: x[1])[0] == added.pk

    filler = Memory.objects.filter(kin=kin).exclude(pk=added.pk).first()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memories_memoryvector SET vector = %s WHERE memory_id = %s",
                       [ranking.vector_to_bytes(hashed_bag_of_words("tea kettle")), filler.pk])
    assert max(nearest(team, kin, "tea kettle", include_shared=False).items(), key=lambda x: x[1])[0] == filler.pk

    Memory.objects.filter(pk=added.pk).update(status=Memory.Status.DELETED)
    assert added.pk not in nearest(team, kin, target, include_shared=False, k=50)
    Memory.objects.filter(pk=added.pk).update(status=Memory.Status.ACTIVE)
    assert added.pk in nearest(team, kin, target, include_shared=False, k=1)
    Memory.objects.filter(pk=added.pk).update(embedding_model="other-embedding")
    assert added.pk not in nearest(team, kin, target, include_shared=False, k=50)
    assert len(loads) == 1  # all of that by fetching the changed rows only

    Memory.objects.filter(pk=filler.pk).update(kin=None)  # moved to the shared scope
    assert filler.pk not in nearest(team, kin, "tea kettle", include_shared=False, k=50)
    assert filler.pk in nearest(team, None, "tea kettle", k=1)
    Memory.objects.filter(pk=filler.pk).delete()
    assert filler.pk not in nearest(team, None, "tea kettle", k=50)
    assert filler.pk not in nearest(team, kin, "tea kettle", k=50)
    assert not MemoryVector.objects.filter(memory_id=filler.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_cache_follows_writes_to_the_vector_table(team, kin, monkeypatch):
    """Writes to MemoryVector alone (raw SQL, bulk upsert, QuerySet.update, delete), by no
    service, as another process's would be: the table's trigger stamps the memory, so a
    warm cache fetches just the changed rows."""
    loads = count_loads(monkeypatch)
    create([vector_row(team, kin, f"filler note n{n}") for n in range(10)])
    assert len(nearest(team, kin, "anything", k=50, include_shared=False)) == 10 and len(loads) == 1
    bare = Memory.objects.create(team=team, kin=kin, content="a memory whose vector comes later", embedding_model=MODEL)
    first, second, third = Memory.objects.filter(kin=kin).exclude(pk=bare.pk).order_by("id")[:3]
    tea = ranking.vector_to_bytes(hashed_bag_of_words("tea kettle"))

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO memories_memoryvector (memory_id, vector) VALUES (%s, %s)", [bare.pk, tea])
    assert nearest(team, kin, "tea kettle", k=1, include_shared=False)[bare.pk] == pytest.approx(1.0)

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM memories_memoryvector WHERE memory_id = %s", [bare.pk])
    assert bare.pk not in nearest(team, kin, "tea kettle", k=50, include_shared=False)

    MemoryVector.objects.bulk_create([MemoryVector(memory_id=first.pk, vector=tea)], update_conflicts=True,
                                     unique_fields=["memory"], update_fields=["vector"])
    assert nearest(team, kin, "tea kettle", k=1, include_shared=False)[first.pk] == pytest.approx(1.0)

    MemoryVector.objects.filter(memory_id=second.pk).update(vector=tea)
    assert set(nearest(team, kin, "tea kettle", k=2, include_shared=False)) == {first.pk, second.pk}

    services.memory_vector_set(memory_id=third.pk, vector=tea)
    services.memory_vector_set(memory_id=first.pk, vector=None)
    assert set(nearest(team, kin, "tea kettle", k=2, include_shared=False)) == {second.pk, third.pk}
    assert first.pk not in nearest(team, kin, "anything", k=50, include_shared=False)

    MemoryVector.objects.filter(memory__kin=kin).delete()
    assert nearest(team, kin, "tea kettle", k=50, include_shared=False) == {}
    assert len(loads) == 1  # every change by fetching the changed rows only


def test_deleting_a_memory_or_its_kin_deletes_its_vector(team, kin):
    rows = create([vector_row(team, kin, f"note n{n}") for n in range(3)])
    rows[0].delete()
    assert set(MemoryVector.objects.values_list("memory_id", flat=True)) == {rows[1].pk, rows[2].pk}
    kin.delete()
    assert not MemoryVector.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_services_writes_reach_a_warm_cache(team, kin):
    with provider_override(ScriptedProvider()):
        memory = add(team, kin, "Maria drinks espresso daily").memory
        assert memory.pk in nearest(team, kin, "espresso daily", k=1)
        services.memory_update(memory=memory, actor=Actor(label="test"), content="Maria drinks green tea")
        assert nearest(team, kin, "espresso daily", k=1)[memory.pk] < 0.5
        assert nearest(team, kin, "green tea", k=1)[memory.pk] > 0.5
        services.memory_delete(memory=Memory.objects.get(pk=memory.pk), actor=Actor(label="test"))
        assert memory.pk not in nearest(team, kin, "green tea", k=50)


@pytest.mark.django_db(transaction=True)
def test_a_write_that_rolls_back_never_reaches_the_cache(team, kin, monkeypatch):
    loads = count_loads(monkeypatch)
    create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    assert len(nearest(team, kin, "anything", k=50, include_shared=False)) == 5 and len(loads) == 1

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        [phantom] = create([vector_row(team, kin, "coffee beans grinder")])
        # The writing transaction sees its own row...
        assert phantom.pk in nearest(team, kin, "coffee beans grinder", k=1, include_shared=False)
        raise Rollback
    # ...nobody sees it after the rollback, and the cache did not keep it.
    assert phantom.pk not in nearest(team, kin, "coffee beans grinder", k=50, include_shared=False)
    # The next committed write gets the generation the phantom had: it is seen.
    [real] = create([vector_row(team, kin, "tea kettle")])
    assert real.pk in nearest(team, kin, "tea kettle", k=1, include_shared=False)
    assert len(loads) == 1


@pytest.mark.django_db(transaction=True)
def test_cache_is_capped(team, kin, settings):
    create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    settings.MEMORY_VECTOR_CACHE_MB = 0
    assert len(nearest(team, kin, "filler", k=50)) == 5
    assert vectors.vector_cache_bytes() == 0


@pytest.mark.django_db(transaction=True)
def test_warm_search_reads_one_row_per_scope(team, kin, django_assert_num_queries):
    create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    nearest(team, kin, "filler", k=50)
    with django_assert_num_queries(1):  # the kin's scope row and the shared one's
        assert len(nearest(team, kin, "filler", k=50)) == 5
    create([vector_row(team, kin, "tea kettle")])
    with django_assert_num_queries(2):  # and the row changed since
        assert len(nearest(team, kin, "filler", k=50)) == 6
    vectors.vector_cache_clear()
    with django_assert_num_queries(2):  # and every vector of both scopes
        assert len(nearest(team, kin, "filler", k=50)) == 6


@pytest.mark.django_db(transaction=True)
def test_a_stale_instance_saved_over_a_newer_model_is_seen(team, kin):
    [memory] = create([vector_row(team, kin, "coffee beans grinder")])
    stale = Memory.objects.get(pk=memory.pk)
    Memory.objects.filter(pk=memory.pk).update(embedding_model="other-embedding")
    assert memory.pk not in nearest(team, kin, "coffee beans grinder", k=50)
    stale.importance = 9
    stale.save()  # writes its old model (and vector_seq) back
    assert nearest(team, kin, "coffee beans grinder", k=1)[memory.pk] == pytest.approx(1.0)


def scope_row(team, kin):
    from memories.models import MemoryVectorScope

    return MemoryVectorScope.objects.get(team_id=team.pk, kin_key=kin.pk if kin else 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_bumps_its_scope_once(team, kin):
    """A bulk write writes the scope row once, not once per row (a row version each)."""
    create([vector_row(team, kin, "first")])
    before = scope_row(team, kin).generation
    with transaction.atomic():
        create([vector_row(team, kin, f"note n{n}") for n in range(50)])
        Memory.objects.filter(kin=kin).update(status=Memory.Status.DELETED)
    assert scope_row(team, kin).generation == before + 1
    assert set(Memory.objects.filter(kin=kin).values_list("vector_seq", flat=True)) == {before + 1}
    epoch = scope_row(team, kin).epoch
    Memory.objects.filter(kin=kin).update(kin=None)
    assert scope_row(team, kin).epoch != epoch


# --- the duplicate check's bit-code prefilter, and the scan thread ---------------------------------

DIMS = 384


def unit(vector):
    return vector / np.linalg.norm(vector)


def at_cosine(query, cosine, rng):
    """A unit vector at exactly `cosine` from the unit vector `query`, in a random direction."""
    other = rng.standard_normal(len(query))
    other = unit(other - (other @ query) * query)
    return cosine * query + np.sqrt(1 - cosine**2) * other


def planted(team, kin, rng, *, unrelated=3000, neighbours=400):
    """A query vector and a scope around it: `unrelated` random vectors, `neighbours` at
    cosine 0.80-0.90 (more than the prefilter's shortlist, nearer than anything random),
    two near misses at 0.92, and three duplicates at 0.931, 0.96 and 0.995."""
    query = unit(rng.standard_normal(DIMS))
    vectors_by_role = {
        "unrelated": [unit(rng.standard_normal(DIMS)) for _ in range(unrelated)],
        "neighbour": [at_cosine(query, c, rng) for c in rng.uniform(0.80, 0.90, neighbours)],
        "near miss": [at_cosine(query, 0.92, rng) for _ in range(2)],
        "duplicate": [at_cosine(query, c, rng) for c in (0.931, 0.96, 0.995)],
    }
    # Told apart by letters, not digits: a digit is a value, and a value the query lacks rules a
    # duplicate out before its vector is looked at (ranking.values_differ).
    rows = [vector_row(team, kin, f"{role} item i{''.join(chr(97 + int(d)) for d in str(n))}", vector=vector.tolist())
            for role, vectors_of_role in vectors_by_role.items() for n, vector in enumerate(vectors_of_role)]
    create(rows, batch_size=1000)
    return Embedding(vector=tuple(query.tolist()), model=MODEL), rows


def exact(embedding, rows):
    """Every active row's cosine with the query, computed here from the stored bytes."""
    query = np.asarray(embedding.vector)
    return {row.pk: float(np.asarray(ranking.vector_from_bytes(row.test_vector)) @ query) for row in rows
            if row.status == Memory.Status.ACTIVE}


def duplicates(team, kin, embedding, also=frozenset()):
    return vectors.near_duplicates_start(team=team, kin=kin, embedding=embedding,
                                         min_cosine=ranking.DUPLICATE_MIN_COSINE, k=20).result(also)


@pytest.mark.django_db(transaction=True)
def test_prefilter_finds_every_duplicate_among_thousands_and_hundreds_of_neighbours(team, kin):
    """Committed rows, so the matrix is cached and the check goes through the bit codes."""
    embedding, rows = planted(team, kin, np.random.default_rng(1))
    cosines = exact(embedding, rows)
    expected = {i for i, c in cosines.items() if c >= ranking.DUPLICATE_MIN_COSINE}
    assert len(expected) == 3 and len(rows) > 10 * vector_matrix.DUPLICATE_SHORTLIST
    vectors.nearest(team=team, kin=kin, include_shared=False, embedding=embedding, k=1)
    cached = vectors.vector_cache_bytes()
    found = duplicates(team, kin, embedding)
    assert vectors.vector_cache_bytes() > cached  # its bit codes were built
    assert set(found) == expected
    for memory_id, cosine in found.items():
        assert cosine == pytest.approx(cosines[memory_id], abs=1e-5)
    # The text candidates' own similarities come with them, whatever their cosine.
    unrelated = rows[0].pk
    assert duplicates(team, kin, embedding, also={unrelated})[unrelated] == pytest.approx(cosines[unrelated], abs=1e-5)


def test_duplicate_check_finds_by_meaning_among_thousands(team, kin):
    """Rows this test's transaction wrote: the matrix serves this check alone (not cached),
    so it is scanned exactly rather than coded."""
    embedding, rows = planted(team, kin, np.random.default_rng(2))
    best = max(exact(embedding, rows).items(), key=lambda item: item[1])[0]
    found = memory_find_duplicate(team=team, kin=kin, content="Maria prefers green tea", embedding=embedding)
    assert found is not None and found.pk == best


@pytest.mark.django_db(transaction=True)
def test_prefilter_keeps_exact_answers_over_many_queries(team, kin):
    """Twenty queries against one cached scope of clusters: whatever the query, the rows
    at the threshold or more are exactly those the full scan finds."""
    rng = np.random.default_rng(3)
    base = [unit(rng.standard_normal(DIMS)) for _ in range(40)]
    # Clusters: each base vector with 60 variants at cosine 0.85-1.0, so many queries have
    # dozens of rows around the threshold.
    rows = [vector_row(team, kin, f"variant v{n}", vector=at_cosine(b, c, rng).tolist())
            for n, b in enumerate(base) for c in rng.uniform(0.85, 1.0, 60)]
    rows += [vector_row(team, kin, f"random r{n}", vector=unit(rng.standard_normal(DIMS)).tolist())
             for n in range(1500)]
    create(rows, batch_size=1000)
    for b in base[:20]:
        embedding = Embedding(vector=tuple(at_cosine(b, 0.97, rng).tolist()), model=MODEL)
        cosines = exact(embedding, rows)
        expected = sorted((i for i, c in cosines.items() if c >= ranking.DUPLICATE_MIN_COSINE),
                          key=lambda i: -cosines[i])[:20]
        assert set(duplicates(team, kin, embedding)) == set(expected)


def test_threaded_nearest_equals_the_exact_scan_with_the_text_query_between(team, kin):
    embedding, rows = planted(team, kin, np.random.default_rng(4), unrelated=2000, neighbours=100)
    rng = np.random.default_rng(8)
    shared = [vector_row(team, None, f"shared s{n}", vector=unit(rng.standard_normal(DIMS)).tolist())
              for n in range(200)]
    create(shared)
    cosines = exact(embedding, rows + shared)
    pending = vectors.nearest_start(team=team, kin=kin, include_shared=True, embedding=embedding, k=50)
    # What memory_search does meanwhile on this thread: the full-text query.
    assert memory_search(team=team, kin=kin, query="neighbour item") != []
    scores = pending.result(also={shared[0].pk})
    best = sorted(cosines, key=lambda i: -cosines[i])[:50]
    assert set(scores) == set(best) | {shared[0].pk}
    for memory_id, score in scores.items():
        assert score == pytest.approx(cosines[memory_id], abs=1e-5)


@pytest.mark.django_db(transaction=True)
def test_the_scan_thread_sees_what_this_transaction_wrote(team, kin, monkeypatch):
    """The scopes are read on the caller's connection: inside a transaction, its own writes
    to a warm matrix (a new row, a changed vector, a removed row) are what both scans see."""
    loads = count_loads(monkeypatch)
    embedding, rows = planted(team, kin, np.random.default_rng(5), unrelated=1000, neighbours=300)
    dup_ids = [row.pk for row in rows if row.content.startswith("duplicate")]
    assert set(duplicates(team, kin, embedding)) == set(dup_ids)  # warm, codes built
    query = np.asarray(embedding.vector)
    with transaction.atomic():
        [new] = create(
            [vector_row(team, kin, "new", vector=at_cosine(query, 0.99, np.random.default_rng(6)).tolist())])
        Memory.objects.filter(pk=dup_ids[0]).update(status=Memory.Status.DELETED)
        MemoryVector.objects.filter(memory_id=dup_ids[1]).update(vector=ranking.vector_to_bytes((-query).tolist()))
        found = duplicates(team, kin, embedding, also={dup_ids[1]})
        assert set(found) == {new.pk, dup_ids[2], dup_ids[1]}
        assert found[dup_ids[1]] == pytest.approx(-1.0, abs=1e-5)
        top = vectors.nearest(team=team, kin=kin, include_shared=False, embedding=embedding, k=2)
        assert set(top) == {new.pk, dup_ids[2]}
        transaction.set_rollback(True)
    assert set(duplicates(team, kin, embedding)) == set(dup_ids)
    assert len(loads) == 1


@pytest.mark.django_db(transaction=True)
def test_bit_codes_follow_committed_writes_through_growth(team, kin, monkeypatch):
    loads = count_loads(monkeypatch)
    rng = np.random.default_rng(7)
    embedding, rows = planted(team, kin, rng, unrelated=500, neighbours=300)
    query = np.asarray(embedding.vector)
    dup_ids = {row.pk for row in rows if row.content.startswith("duplicate")}
    assert set(duplicates(team, kin, embedding)) == dup_ids  # codes built
    # More rows than the matrix's spare capacity: it grows, its codes with it.
    added = create(
        [vector_row(team, kin, f"more m{n}", vector=unit(rng.standard_normal(DIMS)).tolist()) for n in range(300)]
        + [vector_row(team, kin, "late duplicate", vector=at_cosine(query, 0.97, rng).tolist())])
    Memory.objects.filter(pk=min(dup_ids)).update(status=Memory.Status.DELETED)
    assert set(duplicates(team, kin, embedding)) == dup_ids - {min(dup_ids)} | {added[-1].pk}
    assert len(loads) == 1  # patched, not reloaded


def test_a_forked_child_gets_its_own_scan_threads_and_cache():
    """A Celery or gunicorn child forked while the parent's scan threads ran (or held the
    cache's lock) neither waits on those threads nor on that lock."""
    vectors._scan_executor().submit(int).result()  # the parent's scan threads exist
    with vectors._cache_lock:
        pid = os.fork()
        if pid == 0:  # the child: every step must finish (a hang would fail the wait below)
            ok = vectors.vector_cache_bytes() == 0 and vectors._scan_executor().submit(int, "2").result(timeout=5) == 2
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 10
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert waited[0] == pid and os.waitstatus_to_exitcode(waited[1]) == 0


@pytest.mark.django_db(transaction=True)
def test_prefilter_finds_a_duplicate_behind_more_near_misses_than_its_shortlist(team, kin):
    """Templated memories (a log line a day, a ticket a row) can put more rows just under the
    threshold than the shortlist holds: the duplicate above it must still be found."""
    rng = np.random.default_rng(9)
    query = unit(rng.standard_normal(DIMS))
    rows = [vector_row(team, kin, f"near miss n{n}", vector=at_cosine(query, 0.92, rng).tolist())
            for n in range(4 * vector_matrix.DUPLICATE_SHORTLIST)]
    rows.append(vector_row(team, kin, "duplicate", vector=at_cosine(query, 0.935, rng).tolist()))
    create(rows, batch_size=1000)
    embedding = Embedding(vector=tuple(query.tolist()), model=MODEL)
    vectors.nearest(team=team, kin=kin, include_shared=False, embedding=embedding, k=1)  # cached: codes used
    assert set(duplicates(team, kin, embedding)) == {rows[-1].pk}
