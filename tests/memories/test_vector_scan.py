"""Vector search without pgvector (memories.search.vectors): every vector of the scope is
scanned, however many newer memories there are; models and scopes are never mixed; and
each process's cached matrices follow writes made by any path, in any process, once
committed (never a write that rolled back)."""
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from kinsite.llm.providers import ScriptedProvider, hashed_bag_of_words, provider_override
from memories import ranking, services
from memories.embeddings import Embedding
from memories.models import Memory, MemoryVector
from memories.search import memory_search, vectors
from memories.services import Actor
from tests.factories import KinFactory
from tests.memories.embedders import SynonymEmbedder

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
