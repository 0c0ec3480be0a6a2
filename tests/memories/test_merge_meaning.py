"""Duplicate merging (SPEC §6: "same meaning, not only same text"): two statements whose
words differ only in a stop word that carries the meaning ("not", "before" / "after") say
different things and stay two memories, like "Meeting at 3pm" / "Meeting at 5pm" (issue 14,
item 14). The word rule compares stemmed terms without stop words, so today "Maria is not
vegan" is taken for "Maria is vegan": the API answers 200 `"created": false` and rewrites
the existing memory's content.

Found by verification of issue 14 from outside:
POST /api/v1/kins/5/memories/ {"content": "Maria is not vegan", "category": "fact"} → 201 (id 18),
then {"content": "Maria is vegan", "category": "fact"} → 200 {"id": 18, "created": false, ...}."""

import pytest

from memories import services
from memories.models import Memory
from memories.services import Actor

ACTOR = Actor(label="user:maria")

DIFFERENT_BY_A_STOP_WORD = [
    ("Maria is not vegan", "Maria is vegan"),
    ("Maria does not like tea", "Maria likes tea"),
    ("Backups run before the deploy", "Backups run after the deploy"),
]


# A private cache per test (private_cache, tests/memories/conftest.py).
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.django_db
@pytest.mark.parametrize("first, second", DIFFERENT_BY_A_STOP_WORD)
def test_statements_differing_in_a_meaning_stop_word_stay_two_memories(team, kin, first, second):
    original = services.memory_add(team=team, kin=kin, content=first, actor=ACTOR).memory
    result = services.memory_add(team=team, kin=kin, content=second, actor=ACTOR)
    original.refresh_from_db()
    assert result.created, f"{second!r} was merged into {first!r}"
    assert original.content == first
    assert sorted(Memory.objects.filter(team=team).values_list("content", flat=True)) == sorted([first, second])


@pytest.mark.parametrize("first, second", [
    *DIFFERENT_BY_A_STOP_WORD,
    ("Maria doesn't eat meat on weekdays at home", "Maria does eat meat on weekdays at home"),
    ("Maria can't attend the planning meeting", "Maria can attend the planning meeting"),
    ("Maria wants more coffee in the morning", "Maria wants coffee in the morning"),
    ("No deploys on Friday afternoons for the team", "Deploys on Friday afternoons for the team"),
])
def test_a_meaning_word_keeps_statements_apart_even_when_their_vectors_agree(first, second):
    # Embedders barely see a "not": a near-identical vector must not merge them either.
    from memories import ranking

    assert not ranking.is_duplicate(new_terms=ranking.term_set(second), old_terms=ranking.term_set(first),
                                    new_subject="", old_subject="", vector_similarity=0.99)


@pytest.mark.parametrize("first, second", [
    ("Maria doesn't like tea", "Maria does not like tea"),
    ("Maria can't swim", "Maria cannot swim"),
    ("Maria won’t travel in winter", "Maria will not travel in winter"),
    ("Maria is not vegan", "maria is NOT vegan!"),
])
def test_the_same_negation_spelled_differently_still_merges(first, second):
    from memories import ranking

    assert ranking.is_duplicate(new_terms=ranking.term_set(second), old_terms=ranking.term_set(first),
                                new_subject="", old_subject="")
