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
from memories.models import Memory
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
    vector = hashed_bag_of_words(content) if vector is None else vector
    return Memory(team=team, kin=kin, content=content, status=status,
                  embedding=ranking.vector_to_bytes(vector), embedding_model=model)


def bury(team, kin, oldest, count=NEWER):
    """`count` newer memories with vectors, none sharing a word with the tests' queries."""
    Memory.objects.filter(pk=oldest.pk).update(updated_at=timezone.now() - timedelta(days=400))
    Memory.objects.bulk_create(
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
        assert Memory.objects.filter(kin=kin, embedding__isnull=False).count() == NEWER + 1
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
    far = Memory.objects.create(**{f: getattr(vector_row(team, kin, "budget ledger audit"), f)
                                   for f in ("team", "kin", "content", "embedding", "embedding_model")})
    Memory.objects.bulk_create([vector_row(team, kin, f"espresso number n{n}") for n in range(20)])
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
    Memory.objects.bulk_create([same, other_model, other_dims])
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
    Memory.objects.bulk_create(rows.values())
    ids = {name: row.pk for name, row in rows.items()}
    assert set(nearest(team, kin, text, k=50)) == {ids["own"], ids["shared"]}
    assert set(nearest(team, kin, text, k=50, include_shared=False)) == {ids["own"]}
    assert set(nearest(team, None, text, k=50)) == {ids["shared"]}
    # A kin passed with the wrong team finds nothing of either.
    assert set(nearest(other_team, kin, text, k=50, include_shared=False)) == set()


def test_k_nearest_are_the_most_similar(team, kin):
    Memory.objects.bulk_create([vector_row(team, kin, " ".join(f"w{i}" for i in range(n + 1))) for n in range(30)])
    scores = nearest(team, kin, "w0 w1 w2", k=3)
    assert len(scores) == 3
    exact = {m.pk: ranking.cosine(hashed_bag_of_words("w0 w1 w2"), ranking.vector_from_bytes(m.embedding))
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
    Memory.objects.bulk_create([vector_row(team, kin, f"filler note n{n}") for n in range(10)])
    target = "coffee beans grinder"
    assert nearest(team, kin, target, include_shared=False) and len(loads) == 1
    assert vectors.vector_cache_bytes() > 0

    [added] = Memory.objects.bulk_create([vector_row(team, kin, target)])
    assert max(nearest(team, kin, target, include_shared=False).items(), key=lambda x: x[1])[0] == added.pk

    filler = Memory.objects.filter(kin=kin).exclude(pk=added.pk).first()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE memories_memory SET embedding = %s WHERE id = %s",
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
    Memory.objects.bulk_create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    assert len(nearest(team, kin, "anything", k=50, include_shared=False)) == 5 and len(loads) == 1

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        [phantom] = Memory.objects.bulk_create([vector_row(team, kin, "coffee beans grinder")])
        # The writing transaction sees its own row...
        assert phantom.pk in nearest(team, kin, "coffee beans grinder", k=1, include_shared=False)
        raise Rollback
    # ...nobody sees it after the rollback, and the cache did not keep it.
    assert phantom.pk not in nearest(team, kin, "coffee beans grinder", k=50, include_shared=False)
    # The next committed write gets the generation the phantom had: it is seen.
    [real] = Memory.objects.bulk_create([vector_row(team, kin, "tea kettle")])
    assert real.pk in nearest(team, kin, "tea kettle", k=1, include_shared=False)
    assert len(loads) == 1


@pytest.mark.django_db(transaction=True)
def test_cache_is_capped(team, kin, settings):
    Memory.objects.bulk_create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    settings.MEMORY_VECTOR_CACHE_MB = 0
    assert len(nearest(team, kin, "filler", k=50)) == 5
    assert vectors.vector_cache_bytes() == 0


@pytest.mark.django_db(transaction=True)
def test_warm_search_reads_one_row_per_scope(team, kin, django_assert_num_queries):
    Memory.objects.bulk_create([vector_row(team, kin, f"filler note n{n}") for n in range(5)])
    nearest(team, kin, "filler", k=50)
    with django_assert_num_queries(1):  # the kin's scope row and the shared one's
        assert len(nearest(team, kin, "filler", k=50)) == 5
    Memory.objects.bulk_create([vector_row(team, kin, "tea kettle")])
    with django_assert_num_queries(2):  # and the row changed since
        assert len(nearest(team, kin, "filler", k=50)) == 6
    vectors.vector_cache_clear()
    with django_assert_num_queries(2):  # and every vector of both scopes
        assert len(nearest(team, kin, "filler", k=50)) == 6


@pytest.mark.django_db(transaction=True)
def test_a_stale_instance_saved_over_a_newer_vector_is_seen(team, kin):
    [memory] = Memory.objects.bulk_create([vector_row(team, kin, "coffee beans grinder")])
    stale = Memory.objects.get(pk=memory.pk)
    Memory.objects.filter(pk=memory.pk).update(embedding=ranking.vector_to_bytes(hashed_bag_of_words("tea kettle")))
    assert nearest(team, kin, "tea kettle", k=1)[memory.pk] == pytest.approx(1.0)
    stale.importance = 9
    stale.save()  # writes its old vector back
    assert nearest(team, kin, "coffee beans grinder", k=1)[memory.pk] == pytest.approx(1.0)


def scope_row(team, kin):
    from memories.models import MemoryVectorScope

    return MemoryVectorScope.objects.get(team_id=team.pk, kin_key=kin.pk if kin else 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_bumps_its_scope_once(team, kin):
    """A bulk write writes the scope row once, not once per row (a row version each)."""
    Memory.objects.bulk_create([vector_row(team, kin, "first")])
    before = scope_row(team, kin).generation
    with transaction.atomic():
        Memory.objects.bulk_create([vector_row(team, kin, f"note n{n}") for n in range(50)])
        Memory.objects.filter(kin=kin).update(status=Memory.Status.DELETED)
    assert scope_row(team, kin).generation == before + 1
    assert set(Memory.objects.filter(kin=kin).values_list("vector_seq", flat=True)) == {before + 1}
    epoch = scope_row(team, kin).epoch
    Memory.objects.filter(kin=kin).update(kin=None)
    assert scope_row(team, kin).epoch != epoch
