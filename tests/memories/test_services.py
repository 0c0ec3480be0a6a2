"""Memory writes: one change row per write, duplicate merging, delete and supersede,
vectors computed at write time without ever losing a memory to the embedder, and
retrieval counts."""

import pytest

from kinsite.llm.providers import provider_override
from kinsite.models import LLMCall
from memories import ranking, services
from memories.models import Memory, MemoryChange, MemoryVector
from memories.search import selectors as search
from memories.services import Actor
from tests.factories import KinFactory
from tests.memories.embedders import BrokenEmbedder, NumberBlindEmbedder, SynonymEmbedder
from tests.support.scripted_model import ScriptedProvider

ACTOR = Actor(label="user:maria")


# A private cache per test (private_cache, tests/memories/conftest.py).
pytestmark = pytest.mark.usefixtures("private_cache")


def add(team, kin, content, **kwargs):
    return services.memory_add(team=team, kin=kin, content=content, actor=kwargs.pop("actor", ACTOR), **kwargs)


def changes(memory):
    return list(MemoryChange.objects.filter(memory=memory).order_by("id"))


def test_add_writes_one_change_row_with_after_snapshot_and_actor(team, kin, user):
    result = add(team, kin, "Maria prefers short answers", category="preference", subject="Maria",
                 importance=7, actor=Actor(label="user:maria", user=user), reason="said so")
    assert result.created
    [change] = changes(result.memory)
    assert change.action == "add"
    assert change.before == {}
    assert change.after == {"kin": kin.pk, "category": "preference", "content": "Maria prefers short answers",
                            "subject": "Maria", "importance": 7, "status": "active", "superseded_by": None}
    assert change.actor == "user:maria" and change.actor_user == user and change.reason == "said so"


def test_update_writes_one_change_row_with_before_and_after(team, kin):
    memory = add(team, kin, "The deploy runs on Fridays").memory
    services.memory_update(
        memory=memory, actor=Actor(label="kin:1"), reason="moved", content="The deploy runs on Mondays", importance=8
    )
    first, second = changes(memory)
    assert second.action == "update" and second.actor == "kin:1" and second.reason == "moved"
    assert second.before["content"] == "The deploy runs on Fridays" and second.before["importance"] == 5
    assert second.after["content"] == "The deploy runs on Mondays" and second.after["importance"] == 8


def test_update_rejects_fields_it_cannot_edit(team, kin):
    memory = add(team, kin, "Tea at four").memory
    with pytest.raises(TypeError):
        services.memory_update(memory=memory, actor=ACTOR, status="deleted")
    assert len(changes(memory)) == 1


def test_deleted_memory_leaves_search_but_keeps_its_history(team, kin):
    memory = add(team, kin, "The office wifi password is on the fridge").memory
    assert [hit.memory for hit in search.memory_search(team=team, kin=kin, query="wifi password", limit=5)] == [memory]

    services.memory_delete(memory=memory, actor=ACTOR, reason="rotated")

    memory.refresh_from_db()
    assert memory.status == "deleted"
    assert search.memory_search(team=team, kin=kin, query="wifi password", limit=5) == []
    add_change, delete_change = changes(memory)
    assert delete_change.action == "delete" and delete_change.reason == "rotated"
    assert delete_change.before["status"] == "active" and delete_change.after["status"] == "deleted"


def test_supersede_links_the_newer_memory_and_records_it(team, kin):
    old = add(team, kin, "The team uses Jenkins for CI").memory
    new = add(team, kin, "The team moved CI to GitHub Actions").memory
    services.memory_supersede(memory=old, actor=Actor(label="consolidation_run:3"), reason="newer", superseded_by=new)
    old.refresh_from_db()
    assert old.status == "superseded" and old.superseded_by == new
    change = changes(old)[-1]
    assert change.action == "supersede"
    assert change.before["superseded_by"] is None and change.after["superseded_by"] == new.pk
    assert [hit.memory for hit in search.memory_search(team=team, kin=kin, query="CI", limit=5)] == [new]


# --- duplicates ---------------------------------------------------------------------------


def test_duplicate_memory_updates_existing(team, kin):
    first = add(team, kin, "Maria prefers short answers", importance=8).memory
    result = add(team, kin, "maria prefers SHORT answers.", importance=4)
    assert not result.created
    assert result.memory.pk == first.pk
    assert Memory.objects.filter(team=team).count() == 1
    result.memory.refresh_from_db()
    assert result.memory.content == "maria prefers SHORT answers."  # newer wording wins
    assert result.memory.importance == 8  # the higher importance is kept
    assert [c.action for c in changes(first)] == ["add", "update"]


def test_an_added_detail_merges_into_the_existing_memory(team, kin):
    first = add(team, kin, "Maria prefers short answers").memory
    result = add(team, kin, "Maria prefers short answers in the morning")
    assert not result.created and result.memory.pk == first.pk


def test_reworded_with_synonym_is_not_merged_by_words_alone(team, kin):
    # Honest limit of the lexical rule: "likes" for "prefers" looks the same to it as
    # "long" for "short", so without an embedder both stay.
    add(team, kin, "Maria prefers short answers")
    result = add(team, kin, "Maria likes short answers.")
    assert result.created


def test_reworded_with_synonym_is_merged_when_vectors_agree(team, kin):
    with provider_override(SynonymEmbedder()):
        first = add(team, kin, "Maria prefers short answers").memory
        result = add(team, kin, "Maria likes brief replies.")
    assert not result.created and result.memory.pk == first.pk


def test_different_fact_is_not_merged(team, kin):
    add(team, kin, "Maria likes tea")
    assert add(team, kin, "Maria likes coffee").created
    assert add(team, kin, "Maria prefers long answers").created
    assert Memory.objects.filter(team=team).count() == 3


def test_same_text_with_different_subjects_is_not_merged(team, kin):
    add(team, kin, "Prefers short answers", subject="Maria")
    assert add(team, kin, "Prefers short answers", subject="Tom").created
    # One side without a subject: the same statement, merged.
    assert not add(team, kin, "Prefers short answers").created


def test_duplicates_are_only_looked_for_in_the_same_scope(team, kin):
    add(team, kin, "Standup is at nine")
    other_kin = KinFactory(team=team)
    assert add(team, other_kin, "Standup is at nine").created
    assert add(team, None, "Standup is at nine").created
    deleted = add(team, kin, "Lunch is at noon").memory
    services.memory_delete(memory=deleted, actor=ACTOR)
    assert add(team, kin, "Lunch is at noon").created


def test_stop_word_only_content_merges_only_on_identical_text(team, kin):
    first = add(team, kin, "It is what it is").memory
    assert add(team, kin, "it is what it is").memory.pk == first.pk
    assert add(team, kin, "It was what it was").created


# Each pair differs only in a word outside Latin letters, a symbol or a number: two facts.
DIFFERENT_BY_ONE_TOKEN = [
    ("uni e\u0301e\u0301e\u0301", "uni \U0010FFFF"),  # "ééé" decomposed vs a non-character
    ("uni ééé", "uni ààà"),
    ("Ravi's answer was हाँ", "Ravi's answer was ना"),  # Hindi yes / no: a letter and its vowel signs
    ("The office is in 東京", "The office is in 大阪"),
    ("Deploy status: ✅", "Deploy status: ❌"),
    ("The price is 5€", "The price is 5$"),
    ("Meeting at 3pm", "Meeting at 5pm"),
    ("Budget is 100", "Budget is 200"),
    # Long enough that one changed word leaves 8 of 10 terms shared, the merge threshold.
    ("The quarterly budget review with finance, sales and marketing is at 3pm in room twelve",
     "The quarterly budget review with finance, sales and marketing is at 5pm in room twelve"),
]


@pytest.mark.parametrize("first, second", DIFFERENT_BY_ONE_TOKEN)
def test_texts_differing_in_a_non_latin_word_symbol_or_number_stay_two_memories(team, kin, first, second):
    add(team, kin, first)
    result = add(team, kin, second)
    assert result.created
    assert sorted(Memory.objects.filter(team=team).values_list("content", flat=True)) == sorted([first, second])


@pytest.mark.parametrize("text", ["The office is in 東京", "Ravi said नमस्ते to the team", "東京オフィス", "✅ ✅",
                                  "Budget is 100"])
def test_the_same_non_latin_symbol_or_number_text_still_merges(team, kin, text):
    first = add(team, kin, text).memory
    result = add(team, kin, text)
    assert not result.created and result.memory.pk == first.pk


def test_vectors_agreeing_do_not_merge_different_numbers(team, kin):
    # Embedders barely see digits: "at 3pm" and "at 5pm" embed almost alike.
    with provider_override(NumberBlindEmbedder()):
        add(team, kin, "Meeting with Maria at 3pm")
        assert add(team, kin, "Meeting with Maria at 5pm").created
        assert not add(team, kin, "Meeting with maria at 5pm.").created
    assert Memory.objects.filter(team=team).count() == 2


# --- vectors at write time ----------------------------------------------------------------


def stored_vector(memory) -> bytes | None:
    """The memory's vector as stored (its MemoryVector row), None without one."""
    row = MemoryVector.objects.filter(memory_id=memory.pk).values_list("vector", flat=True).first()
    return None if row is None else bytes(row)


def test_add_stores_a_float32_vector_when_the_provider_embeds(team, kin):
    with provider_override(ScriptedProvider()):
        memory = add(team, kin, "Maria prefers short answers").memory
    memory.refresh_from_db()
    vector = ranking.vector_from_bytes(stored_vector(memory))
    assert len(vector) == 64 and memory.embedding_model == "scripted-embedding"


def test_no_embedder_stores_no_vector(team, kin):
    memory = add(team, kin, "Maria prefers short answers").memory
    memory.refresh_from_db()
    assert stored_vector(memory) is None and memory.embedding_model == ""


def test_failing_embedder_never_loses_the_memory(team, kin, caplog):
    with provider_override(BrokenEmbedder()):
        result = add(team, kin, "Maria prefers short answers")
    memory = Memory.objects.get(pk=result.memory.pk)
    assert memory.content == "Maria prefers short answers" and stored_vector(memory) is None
    assert LLMCall.objects.filter(kind="embedding", status="error").count() == 1
    assert "Embedding for memory_embed failed" in caplog.text


def test_changing_content_re_embeds_and_a_failure_drops_the_stale_vector(team, kin):
    with provider_override(ScriptedProvider()):
        memory = add(team, kin, "The deploy runs on Fridays").memory
        before = stored_vector(memory)
        services.memory_update(memory=memory, actor=ACTOR, content="Releases happen every Monday morning")
        assert stored_vector(memory) not in (before, None)
    with provider_override(BrokenEmbedder()):
        services.memory_update(memory=memory, actor=ACTOR, content="Releases happen every Tuesday")
    memory.refresh_from_db()
    assert memory.content == "Releases happen every Tuesday" and stored_vector(memory) is None
    assert memory.embedding_model == ""


def test_an_edit_that_keeps_the_content_keeps_the_vector(team, kin):
    with provider_override(ScriptedProvider()):
        memory = add(team, kin, "The deploy runs on Fridays").memory
        before = stored_vector(memory)
        services.memory_update(memory=memory, actor=ACTOR, importance=9, subject="deploys")
    memory.refresh_from_db()
    assert stored_vector(memory) == before and memory.embedding_model == "scripted-embedding"


# --- retrievals ---------------------------------------------------------------------------


def recall(team, kin, query):
    """What the recall tool does: search, then count what it serves."""
    hits = search.memory_search(team=team, kin=kin, query=query, limit=10)
    services.memory_hits_mark_retrieved(hits=hits)
    return hits


def test_retrieval_is_counted_only_when_asked(team, kin):
    hit_memory = add(team, kin, "The printer is on the third floor").memory
    miss = add(team, kin, "Parking is free on weekends").memory
    search.memory_search(team=team, kin=kin, query="printer", limit=10)
    hit_memory.refresh_from_db()
    assert hit_memory.retrieval_count == 0 and hit_memory.last_retrieved_at is None

    recall(team, kin, "printer floor")
    recall(team, kin, "printer")
    hit_memory.refresh_from_db()
    miss.refresh_from_db()
    assert hit_memory.retrieval_count == 2 and hit_memory.last_retrieved_at is not None
    assert miss.retrieval_count == 0


def test_counted_hits_carry_the_counts_they_were_given(team, kin):
    memory = add(team, kin, "The printer is on the third floor").memory

    [hit] = recall(team, kin, "printer")

    stored = Memory.objects.get(pk=memory.pk)
    assert (hit.memory.retrieval_count, hit.memory.last_retrieved_at) == (1, stored.last_retrieved_at)
    assert stored.retrieval_count == 1
