"""Pure ranking and sameness rules of memories.ranking, on hand-made data (no database)."""
from datetime import UTC, datetime, timedelta

import pytest

from memories import ranking
from memories.ranking import Candidate

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
HALF_LIVES = {"fact": 365.0, "knowledge": 365.0, "preference": 120.0, "decision": 21.0}


def candidate(id, *, text=1.0, vector=None, importance=5, category="fact", age_days=0, subject=""):
    return Candidate(id=id, text_score=text, vector_similarity=vector, importance=importance,
                     category=category, updated_at=NOW - timedelta(days=age_days), subject=subject)


def order(candidates, query="anything", limit=10, **kwargs):
    return [r.id for r in ranking.rank(candidates, query=query, now=NOW, half_life_days=HALF_LIVES,
                                       limit=limit, **kwargs)]


def test_higher_importance_ranks_first_at_equal_relevance():
    assert order([candidate(1, importance=3), candidate(2, importance=9)]) == [2, 1]


def test_importance_does_not_beat_a_much_better_text_match():
    assert order([candidate(1, text=1.0, importance=3), candidate(2, text=0.4, importance=10)]) == [1, 2]


def test_old_decision_sinks_below_a_fresh_one():
    assert order([candidate(1, category="decision", age_days=120), candidate(2, category="decision", age_days=1),
                  ], relative_cutoff=0) == [2, 1]


def test_equally_old_fact_keeps_its_place_but_decision_sinks():
    old_fact = candidate(1, category="fact", age_days=120)
    old_decision = candidate(2, category="decision", age_days=120)
    fresh_weaker = candidate(3, category="knowledge", text=0.8)
    assert order([old_fact, old_decision, fresh_weaker], relative_cutoff=0) == [1, 3, 2]
    fact_recency = ranking.recency_factor(category="fact", updated_at=old_fact.updated_at, now=NOW,
                                          half_life_days=HALF_LIVES)
    decision_recency = ranking.recency_factor(category="decision", updated_at=old_decision.updated_at, now=NOW,
                                              half_life_days=HALF_LIVES)
    assert fact_recency > 0.8
    assert decision_recency < 0.25


def test_recency_never_drops_below_its_floor():
    ancient = ranking.recency_factor(category="decision", updated_at=NOW - timedelta(days=5000), now=NOW,
                                     half_life_days=HALF_LIVES)
    assert ancient == pytest.approx(ranking.RECENCY_FLOOR)


def test_subject_named_in_the_query_ranks_first():
    candidates = [candidate(1, subject="Tom"), candidate(2, subject="Maria")]
    assert order(candidates, query="what does Maria drink") == [2, 1]
    assert order(candidates, query="what does Tom drink") == [1, 2]


def test_subject_boost_matches_inflections():
    assert ranking.subject_factor(subject="Deployments", query=ranking.term_set("deployment plan")) == 1.5
    assert ranking.subject_factor(subject="", query=ranking.term_set("deployment")) == 1.0


def test_hits_far_below_the_best_are_cut():
    ranked = order([candidate(1, text=10.0), candidate(2, text=1.0), candidate(3, text=5.0)])
    assert ranked == [1, 3]


def test_candidates_without_any_match_are_dropped():
    assert order([candidate(1, text=0.0, vector=None), candidate(2, text=0.0, vector=0.1)],
                 relative_cutoff=0) == []


def test_vector_only_match_is_kept_and_scored():
    [hit] = ranking.rank([candidate(1, text=0.0, vector=0.9)], query="car", now=NOW,
                         half_life_days=HALF_LIVES, limit=5)
    assert hit.text == 0 and hit.vector > 0.8
    assert hit.score > 0


def test_text_and_vector_agreement_beats_either_alone():
    both = candidate(1, text=1.0, vector=0.9)
    text_only = candidate(2, text=1.0, vector=0.1)
    vector_only = candidate(3, text=0.0, vector=0.9)
    assert order([text_only, vector_only, both], relative_cutoff=0)[0] == 1


def test_vectors_are_scaled_by_the_best_cosine_so_a_real_embedders_range_counts():
    # all-MiniLM-L6-v2 gives a question and the memory that answers it ~0.4-0.7, never ~1: the
    # nearest memory found by meaning alone weighs as much as the best one found by words alone.
    by_words = candidate(1, text=4.0, vector=0.1)
    by_meaning = candidate(2, text=0.0, vector=0.55)
    weaker_meaning = candidate(3, text=0.0, vector=0.375)  # half-way between the floor and the best
    ranked = {r.id: r for r in ranking.rank([by_words, by_meaning, weaker_meaning], query="x", now=NOW,
                                            half_life_days=HALF_LIVES, limit=5)}
    assert ranked[1].text == 1.0 and ranked[1].vector == 0.0
    assert ranked[2].vector == pytest.approx(1.0) and ranked[3].vector == pytest.approx(0.5)
    assert ranked[2].score == pytest.approx(ranked[1].score)
    assert ranked[3].score == pytest.approx(ranked[1].score / 2)


def test_no_vector_above_the_floor_means_no_vector_signal():
    # Only unrelated neighbours (cosines at or below VECTOR_FLOOR): none is lifted by being the best of them.
    weak = ranking.VECTOR_FLOOR - 0.05
    ranked = ranking.rank([candidate(1, text=2.0, vector=weak), candidate(2, text=0.0, vector=weak)], query="x",
                          now=NOW, half_life_days=HALF_LIVES, limit=5, relative_cutoff=0)
    assert [(r.id, r.vector) for r in ranked] == [(1, 0.0)]


def test_limit_and_components():
    ranked = ranking.rank([candidate(i, text=10 - i) for i in range(8)], query="x", now=NOW,
                          half_life_days=HALF_LIVES, limit=3)
    assert [r.id for r in ranked] == [0, 1, 2]
    assert set(ranked[0].components()) == {"text", "vector", "importance", "recency", "subject"}
    assert ranking.rank([], query="x", now=NOW, half_life_days=HALF_LIVES, limit=3) == []


def test_term_set_stems_and_drops_stop_words():
    assert ranking.term_set("Maria PREFERS the short answers!") == ranking.term_set("maria preferred short answer")
    assert ranking.term_set("it is what it is") == frozenset()


@pytest.mark.parametrize(
    "old, new, same",
    [
        ("Maria prefers short answers", "maria prefers SHORT answers.", True),
        ("Maria prefers short answers", "Maria prefers short answers in the morning", True),
        # A synonym swap looks exactly like a changed fact to a word-set rule: not merged lexically.
        ("Maria prefers short answers", "Maria likes short answers.", False),
        ("Maria prefers short answers", "Maria prefers long answers", False),
        ("Maria likes tea", "Maria likes coffee", False),
    ],
)
def test_lexical_duplicate_rule(old, new, same):
    assert ranking.is_duplicate(new_terms=ranking.term_set(new), old_terms=ranking.term_set(old),
                                new_subject="", old_subject="") is same


def test_close_vector_makes_a_duplicate_unless_subjects_differ():
    a, b = ranking.term_set("Maria prefers short answers"), ranking.term_set("Maria likes brief replies")
    assert ranking.is_duplicate(new_terms=a, old_terms=b, new_subject="", old_subject="Maria",
                                vector_similarity=0.97)
    assert not ranking.is_duplicate(new_terms=a, old_terms=b, new_subject="", old_subject="",
                                    vector_similarity=0.8)
    assert not ranking.is_duplicate(new_terms=a, old_terms=a, new_subject="Tom", old_subject="Maria",
                                    vector_similarity=1.0)


def test_vectors_round_trip_as_float32_bytes():
    data = ranking.vector_to_bytes([0.5, -1.25, 3.0])
    assert len(data) == 12
    assert ranking.vector_from_bytes(data) == (0.5, -1.25, 3.0)
    assert ranking.vector_from_bytes(None) is None
    assert ranking.cosine([1, 0], [1, 0]) == pytest.approx(1.0)
    assert ranking.cosine([1, 0], [0, 1, 0]) == 0.0


def test_a_lone_neighbour_just_above_the_floor_is_not_a_full_match():
    # Scaling by the best cosine alone made the vector signal jump from 0 at VECTOR_FLOOR to
    # 1.0 just above it, so the nearest of otherwise unrelated memories (a query whose meaning
    # matches nothing) tied the best word match; VECTOR_MIN_SPREAD keeps it small.
    just_above = ranking.VECTOR_FLOOR + 0.01
    by_words, lone_neighbour = candidate(1, text=4.0, vector=0.1), candidate(2, text=0.0, vector=just_above)
    ranked = {r.id: r for r in ranking.rank([by_words, lone_neighbour], query="x", now=NOW,
                                            half_life_days=HALF_LIVES, limit=5, relative_cutoff=0)}
    assert 2 not in ranked or ranked[2].vector < 0.5


def test_the_vector_signal_rises_smoothly_from_the_floor_when_nothing_is_near():
    # Below a best cosine of VECTOR_FLOOR + VECTOR_MIN_SPREAD the signal is (cosine - floor) /
    # spread, not scaled up to 1.0; above it the best candidate gets the full signal again.
    floor, spread = ranking.VECTOR_FLOOR, ranking.VECTOR_MIN_SPREAD
    fused = ranking.fuse([candidate(1, text=0.0, vector=floor + spread / 2), candidate(2, text=0.0, vector=floor)])
    assert fused[1].vector == pytest.approx(0.5) and fused[2].vector == 0.0
    fused = ranking.fuse([candidate(1, text=0.0, vector=floor + spread + 0.1)])
    assert fused[1].vector == pytest.approx(1.0)


@pytest.mark.parametrize(("a", "b", "differ"), [
    ("Option A is chosen", "Option B is chosen", True),
    ("The standup is at 9", "The standup is at 10", True),
    ("Maria has two kids", "Maria has three kids", True),
    ("The release is on Tuesday", "The release is on Thursday", True),
    ("We go camping next month", "We went camping last month", True),
    # The same values, named anywhere (a sentence's first word is not a value, but counts as named).
    ("Alice relocated to Berlin in the spring", "In the spring Alice moved to Berlin", False),
    ("Tuesdays are for planning", "We plan on Tuesday", False),
    ("Dr. Smith owns the budget", "The budget belongs to Dr. Smith", False),
    ("I like tea", "Tea is what I like", False),
])
def test_values_differ(a, b, differ):
    assert ranking.values_differ(a, b) is differ
