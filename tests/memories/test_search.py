"""Memory search: scope, ranking signals, relevance cut-off, odd input, hits built
without reading them again, and the vector path with a fake embedder."""
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from kinsite.llm.providers import provider_override
from memories import services
from memories.models import Memory
from memories.search.candidates import matches_by_id
from memories.search.selectors import memory_search
from memories.services import Actor
from tests.factories import KinFactory, MemoryFactory
from tests.memories.embedders import BrokenEmbedder, SynonymEmbedder
from tests.support.scripted_model import ScriptedProvider

FILLER = [
    "The office plants need water on Mondays",
    "Tom owns the quarterly budget report",
    "The staging server runs in Frankfurt",
    "Aisha reviews every pull request before lunch",
    "The newsletter goes out on the first Thursday",
]


# A private cache per test (private_cache, tests/memories/conftest.py).
pytestmark = pytest.mark.usefixtures("private_cache")


def add(team, kin, content, **kwargs):
    return services.memory_add(team=team, kin=kin, content=content, actor=Actor(label="test"), **kwargs).memory


def search(team, kin, query, **kwargs):
    return memory_search(team=team, kin=kin, query=query, **{"limit": 10, **kwargs})


def contents(hits):
    return [hit.memory.content for hit in hits]


def age(memory, days):
    Memory.objects.filter(pk=memory.pk).update(updated_at=timezone.now() - timedelta(days=days))


def test_hit_carries_memory_score_and_components(team, kin):
    for text in FILLER:
        add(team, kin, text)
    memory = add(team, kin, "Maria prefers espresso after lunch", subject="Maria", importance=8)
    [hit] = search(team, kin, "espresso")
    assert hit.memory == memory
    assert hit.score > 0
    assert set(hit.components) == {"text", "vector", "importance", "recency", "subject"}
    assert hit.components["text"] == 1.0 and hit.components["vector"] == 0.0


def test_more_matching_words_rank_first(team, kin):
    for text in FILLER:
        add(team, kin, text)
    add(team, kin, "The espresso machine is in the kitchen")
    best = add(team, kin, "The espresso machine descaling happens monthly")
    assert search(team, kin, "espresso machine descaling")[0].memory == best


def test_importance_recency_and_subject_change_the_order(team, kin):
    a = add(team, kin, "Deploys happen on Fridays after the retro", category="decision")
    b = add(team, kin, "Deploys need two approvals in the retro", category="decision")
    assert {h.memory for h in search(team, kin, "deploys retro")} == {a, b}

    services.memory_update(memory=b, actor=Actor(label="test"), importance=10)
    assert search(team, kin, "deploys retro")[0].memory == b

    age(b, 90)  # a decision three months old sinks
    assert search(team, kin, "deploys retro")[0].memory == a

    services.memory_update(memory=b, actor=Actor(label="test"), category="fact")
    age(b, 90)  # an equally old fact does not
    assert search(team, kin, "deploys retro")[0].memory == b

    c = add(team, kin, "Deploys are announced in the retro channel", subject="Friday deploys")
    assert search(team, kin, "friday deploys retro")[0].memory == c


def test_only_own_and_shared_memories_of_the_team_are_searched(team, kin, other_team):
    own = add(team, kin, "The invoice template lives in the shared drive")
    shared = add(team, None, "Invoice numbers restart every January")
    add(team, KinFactory(team=team), "The invoice for Acme is overdue")
    other_kin = KinFactory(team=other_team)
    add(other_team, other_kin, "The invoice for Globex is paid")
    add(other_team, None, "Invoice reminders go out weekly")

    assert set(contents(search(team, kin, "invoice"))) == {own.content, shared.content}
    assert contents(search(team, kin, "invoice", include_shared=False)) == [own.content]
    assert contents(search(team, None, "invoice")) == [shared.content]


def test_reading_vector_candidates_by_id_keeps_to_the_scope(team, kin, other_team):
    """The ids of vector-only candidates come from a scoped vector search; reading their
    rows checks the scope again, so an id of another kin or team reads nothing."""
    own = MemoryFactory(team=team, kin=kin, content="Own memory")
    shared = MemoryFactory(team=team, kin=None, content="Shared memory")
    sibling = MemoryFactory(team=team, kin=KinFactory(team=team), content="A sibling kin's memory")
    foreign = MemoryFactory(team=other_team, kin=KinFactory(team=other_team), content="Another team's memory")
    ids = {own.pk, shared.pk, sibling.pk, foreign.pk}

    def read(**scope):
        return {match.id for match in matches_by_id(ids, team=team, **scope)}

    assert read(kin=kin, include_shared=True) == {own.pk, shared.pk}
    assert read(kin=kin, include_shared=False) == {own.pk}
    assert read(kin=None, include_shared=True) == {shared.pk}


def test_inactive_memories_are_not_returned(team, kin):
    MemoryFactory(team=team, kin=kin, content="The old VPN uses port 1194", status=Memory.Status.DELETED)
    MemoryFactory(team=team, kin=kin, content="The VPN moved to WireGuard", status=Memory.Status.SUPERSEDED)
    active = MemoryFactory(team=team, kin=kin, content="VPN access needs a hardware key")
    assert [hit.memory for hit in search(team, kin, "vpn")] == [active]


def test_weak_and_unrelated_matches_are_cut(team, kin):
    for text in FILLER:
        add(team, kin, text)
    strong = add(team, kin, "Maria drinks oat milk cappuccino every morning", importance=9, subject="Maria")
    weak = add(team, kin, "We decided to buy oat biscuits for the party", category="decision", importance=1)
    age(weak, 200)
    hits = search(team, kin, "Maria oat milk cappuccino")
    assert [hit.memory for hit in hits] == [strong]
    assert search(team, kin, "zebra giraffe") == []


def test_limit_defaults_to_memory_top_k(team, kin, settings):
    settings.MEMORY_TOP_K = 3
    for n in range(6):
        add(team, kin, f"Backup job {n} runs nightly on host {n}")
    assert len(memory_search(team=team, kin=kin, query="backup nightly")) == 3
    assert len(search(team, kin, "backup nightly", limit=5)) == 5
    assert search(team, kin, "backup nightly", limit=0) == []


@pytest.mark.parametrize(
    "query",
    [
        "", "   ", "!!!", "the and of", '"unbalanced quote', "a AND b OR NOT c", "NEAR(a b)", "col:foo*",
        "x" * 5000, "word " * 1000, "🍕🚀 pizza 🍕", "'; DROP TABLE memories_memory; --", "\x00nul", "-- /* */",
        "SELECT * FROM memories_memory WHERE 1=1", "(((", "^a$", "ñandú café", "%_%",
    ],
)
def test_any_query_text_is_safe(team, kin, query):
    add(team, kin, "Pizza night is every Friday")
    hits = search(team, kin, query)
    assert isinstance(hits, list)
    if not query.strip() or query in {"!!!", "the and of", "-- /* */", "((("}:
        assert hits == []


def test_hits_carry_every_field_as_stored_without_reading_them_again(team, kin, django_assert_num_queries):
    hit_memory = add(team, kin, "The printer is on the third floor", subject="office", importance=7)
    Memory.objects.filter(pk=hit_memory.pk).update(retrieval_count=4, last_retrieved_at=timezone.now(),
                                                    source_ref="event:12")
    shared = add(team, None, "The printer toner is in the cupboard")
    search(team, kin, "printer")  # the query's lexemes are known after a first search

    # PostgreSQL: the scope's counters of the query's lexemes, then the BM25 statement;
    # SQLite: the FTS5 statement. No read of the hits after ranking.
    with django_assert_num_queries(2 if connection.vendor == "postgresql" else 1):
        hits = {hit.memory.pk: hit.memory for hit in search(team, kin, "printer")}

    assert set(hits) == {hit_memory.pk, shared.pk}
    for memory in (hit_memory, shared):
        stored = Memory.objects.get(pk=memory.pk)
        got = hits[memory.pk]
        for field in Memory._meta.concrete_fields:
            assert getattr(got, field.attname) == getattr(stored, field.attname), field.name
    with django_assert_num_queries(0):
        assert hits[hit_memory.pk].kin == kin and hits[shared.pk].kin is None


def test_category_filter(team, kin):
    add(team, kin, "Coffee is free in the kitchen", category="fact")
    pref = add(team, kin, "Maria takes her coffee black", category="preference")
    assert [h.memory for h in search(team, kin, "coffee", category="preference")] == [pref]


# --- vectors ------------------------------------------------------------------------------


def test_close_vector_finds_a_memory_without_shared_words(team, kin):
    with provider_override(SynonymEmbedder()):
        for text in FILLER:
            add(team, kin, text)
        parked = add(team, kin, "The automobile is parked downstairs")
        hits = search(team, kin, "where is my car")
    assert [hit.memory for hit in hits] == [parked]
    assert hits[0].components["text"] == 0 and hits[0].components["vector"] > 0


def test_text_and_vector_are_fused(team, kin):
    with provider_override(ScriptedProvider()):
        for text in FILLER:
            add(team, kin, text)
        memory = add(team, kin, "Maria prefers short answers")
        [hit] = search(team, kin, "short answers")
    assert hit.memory == memory
    assert hit.components["text"] == 1.0 and hit.components["vector"] > 0.5


def test_memories_without_vectors_are_still_found_by_text(team, kin):
    old = add(team, kin, "Server passwords rotate every quarter")  # written before an embedder existed
    with provider_override(ScriptedProvider()):
        assert [hit.memory for hit in search(team, kin, "passwords rotate")] == [old]


def test_failing_query_embedder_falls_back_to_text(team, kin):
    memory = add(team, kin, "Server passwords rotate every quarter")
    with provider_override(BrokenEmbedder()):
        assert [hit.memory for hit in search(team, kin, "passwords")] == [memory]


def test_query_count_is_bounded_and_does_not_grow_with_memories(team, kin, django_assert_max_num_queries):
    for n in range(3):
        add(team, kin, f"Invoice {n} for the cluster upgrade")
    search(team, kin, "invoice cluster")
    MemoryFactory.create_batch(30, team=team, kin=kin, content="Invoice for the cluster")
    # SQLite: search + rows; PostgreSQL: lexemes (known here) + the scope's counters + search.
    with django_assert_max_num_queries(3):
        assert search(team, kin, "invoice cluster")


# --- common terms (PostgreSQL) ------------------------------------------------------------


@pytest.fixture
def common_terms(monkeypatch):
    """Switches common terms on (a lexeme in at least 3 memories and 30% of the scope is
    common; the production thresholds only bite at thousands of memories) or off."""
    from memories.search import postgres

    def switch(on: bool):
        monkeypatch.setattr(postgres, "COMMON_TERM_MIN_DOCS", 3 if on else 10**9)
        monkeypatch.setattr(postgres, "COMMON_TERM_SHARE", 0.3)

    return switch


def add_common(team, kin):
    # "prefers" in 5 of 10 memories, "updates" and "roadmap" in 4.
    for text in FILLER:
        add(team, kin, text)
    for person in ("Tom", "Aisha", "Kenji", "Lena"):
        add(team, kin, f"{person} prefers updates about the roadmap")
    add(team, kin, "Omar prefers answers in bullet points")


@pytest.mark.postgres
def test_common_terms_score_but_do_not_pull_in_candidates(team, kin, common_terms):
    add_common(team, kin)
    both = add(team, kin, "Maria prefers espresso after lunch")
    rare_only = add(team, kin, "The espresso machine is in the kitchen")
    common_terms(False)
    assert len(search(team, kin, "prefers updates espresso")) > 2
    common_terms(True)
    assert [hit.memory for hit in search(team, kin, "prefers updates espresso")] == [both, rare_only]


@pytest.mark.postgres
def test_query_of_common_terms_only_draws_on_its_rarest_term(team, kin, common_terms):
    add_common(team, kin)
    add(team, kin, "Maria prefers tea")
    common_terms(False)
    assert any("updates" not in hit.memory.content for hit in search(team, kin, "prefers updates"))
    common_terms(True)
    hits = search(team, kin, "prefers updates")
    assert len(hits) == 4 and all("updates" in hit.memory.content for hit in hits)


@pytest.mark.postgres
def test_rare_terms_that_match_nothing_fall_back_to_common_ones(team, kin, common_terms):
    add_common(team, kin)
    common_terms(True)
    hits = search(team, kin, "zebra updates")
    assert len(hits) == 4 and all("updates" in hit.memory.content for hit in hits)


def test_small_scopes_match_every_term(team, kin):
    # With the default thresholds nothing in a small scope is common: a memory matching
    # only a frequent word is still a candidate.
    add_common(team, kin)
    rare = add(team, kin, "Maria prefers espresso after lunch")
    hits = search(team, kin, "espresso answers")
    assert [hit.memory for hit in hits][:1] == [rare]
    assert "Omar prefers answers in bullet points" in contents(hits)


@pytest.mark.postgres
def test_scope_gin_indexes_skip_the_pending_list(db):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin'")
        if cursor.fetchone() is None:
            pytest.skip("btree_gin is not available: migration 0003 keeps the table-wide index")
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'memory_search_%%gin'")
        indexes = dict(cursor.fetchall())
    assert indexes == {"memory_search_kin_gin": ["fastupdate=off"], "memory_search_shared_gin": ["fastupdate=off"]}


@pytest.mark.postgres
def test_query_lexemes_are_read_once_per_term_and_match_the_whole_query(db, monkeypatch,
                                                                       django_assert_num_queries):
    from django.db import connection

    from kinsite.textsearch import query_terms
    from memories.search import postgres

    monkeypatch.setattr(postgres, "_term_lexemes", {})
    monkeypatch.setattr(postgres, "LEXEME_CACHE_TERMS", 8)

    def whole_query(text):
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %s)) ORDER BY lexeme",
                           [" ".join(query_terms(text))])
            return [row[0] for row in cursor.fetchall()]

    first, known, second = ("Running runners ran 3rd x86_64 naïve café über", "runners café",
                            "printers deploy staging servers quarterly budgets running")
    expected = {text: whole_query(text) for text in (first, known, second, "don t s")}
    with django_assert_num_queries(1):
        assert postgres._query_lexemes(query_terms(first)) == expected[first]
    with django_assert_num_queries(0):  # every term known
        assert postgres._query_lexemes(query_terms(known)) == expected[known]
    # Over the bound the cache starts again; the answer is the same.
    with django_assert_num_queries(1):
        assert postgres._query_lexemes(query_terms(second)) == expected[second]
    assert len(postgres._term_lexemes) <= 8
    with django_assert_num_queries(1):  # PostgreSQL's stop words: no lexeme
        assert postgres._query_lexemes(query_terms("don t s")) == [] == expected["don t s"]


@pytest.mark.postgres
def test_query_of_common_terms_only_reads_a_bounded_number_of_memories(team, kin, common_terms, monkeypatch):
    from memories.search import postgres

    add_common(team, kin)  # "updates" in 4 memories, "prefers" in 5
    common_terms(True)
    assert len(search(team, kin, "prefers updates")) == 4
    monkeypatch.setattr(postgres, "FALLBACK_CANDIDATES", 2)
    hits = search(team, kin, "prefers updates")
    assert len(hits) == 2 and all("updates" in hit.memory.content for hit in hits)
    # A rare term that matches nothing falls back to the same bounded read.
    assert len(search(team, kin, "zebra updates")) == 2


@pytest.mark.postgres
def test_a_lexeme_in_common_term_max_docs_memories_is_common_in_any_scope(team, kin, monkeypatch):
    from memories.search import postgres

    add_common(team, kin)  # 10 memories: "prefers" in 5, "updates" in 4, "roadmap" in 4
    monkeypatch.setattr(postgres, "COMMON_TERM_MIN_DOCS", 2)
    monkeypatch.setattr(postgres, "COMMON_TERM_SHARE", 0.9)  # by share alone: 9 of 10
    params = {"team": team.pk, "kin": kin.pk}
    assert postgres.scope_stats(params, True, ["prefer", "updat"]).common == {}
    monkeypatch.setattr(postgres, "COMMON_TERM_MAX_DOCS", 5)
    assert postgres.scope_stats(params, True, ["prefer", "updat"]).common == {"prefer": 5}


# --- BM25 statistics at scale -------------------------------------------------------------------

def add_unrelated(team, kin, count):
    # Short memories sharing no word with the queries below, as a kin's thousands of
    # memories about other things (bulk: the duplicate check would merge them).
    Memory.objects.bulk_create([Memory(team=team, kin=kin, content=f"Tom owns budget report {n % 7}")
                                for n in range(count)])


@pytest.mark.parametrize("unrelated", [0, 1000])
def test_memories_sharing_no_query_word_do_not_change_the_ranking(team, kin, unrelated):
    # The rare word's one memory is long; twenty short ones only name the person. Over the
    # whole scope's statistics, a thousand short unrelated memories raise the name's idf
    # towards the rare word's and shrink the average length, so the long memory fell from
    # first to below the ten short ones. Over the statistics of the memories that match,
    # they change nothing.
    evidence = add(team, kin, "I finally started learning the ukulele last spring after years of wanting to play "
                              "songs on the beach with my cousins and their neighbours")
    Memory.objects.bulk_create([Memory(team=team, kin=kin, content="Priya smiled") for _ in range(20)])
    add_unrelated(team, kin, unrelated)
    hits = search(team, kin, "Priya ukulele")
    assert hits[0].memory == evidence


@pytest.mark.sqlite
def test_a_memory_saying_the_query_word_more_often_ranks_first(team, kin):
    # SQLite counts a term's occurrences (its stemmed forms alike), as FTS5's bm25() did; a
    # term frequency of 1 whatever the count tied these two (same length in characters, same
    # date), and the older won. The "|" is the marker sqlite.text_scores counts with: the
    # text's own do not count. PostgreSQL counts a lexeme once per memory (postgres.py).
    once, twice = Memory.objects.bulk_create([
        Memory(team=team, kin=kin, content="We painted the lake ||| then crossed the hills"),
        Memory(team=team, kin=kin, content="We painted the lake and then painted the hills"),
    ])
    Memory.objects.filter(pk__in=[once.pk, twice.pk]).update(updated_at=timezone.now())
    hits = search(team, kin, "painting")
    assert [hit.memory for hit in hits] == [twice, once]
    assert hits[0].components["text"] == 1.0 and hits[1].components["text"] < 1.0
