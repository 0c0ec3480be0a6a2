"""bench/memory_relevance.py, small, inside the test database: one LoCoMo conversation with a
little filler and a few questions. Checks that the answer key points at the right memories,
that search still finds them, that the baseline scores at least as many candidates as the
default setting, and that the JSON report has its fields."""
import json

import pytest
from django.db import connection

from bench.common import write_results
from bench.memory_relevance import DATA_DIR, conversation_turns, load_conversations, run
from memories.models import Memory
from memories.search import postgres

FILLER = 300
QUESTIONS = 20
# Measured 2026-12-02 with these parameters (conversation 26, its first 20 questions):
# recall@10 0.588 on SQLite, 0.562 on PostgreSQL. The floor sits clearly below both: it
# catches a broken answer key or a search that stopped finding the turns, not a small
# ranking change.
RECALL_AT_10_FLOOR = 0.45

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def conversation():
    if not DATA_DIR.is_dir():
        pytest.skip(f"LoCoMo data not found at {DATA_DIR}")
    return load_conversations(DATA_DIR)[0]


@pytest.fixture
def figures(conversation):
    defaults = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    figures = run(conversations=1, questions_per_conversation=QUESTIONS, filler=FILLER,
                  shares=[defaults[0]], min_docs=[defaults[1]])
    # The grid changes the search's module constants; they must be back afterwards.
    assert defaults == (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    return figures


def test_answer_key_points_at_the_cited_turns(figures, conversation):
    conversation_id, data = conversation
    turns = {turn["external_id"]: turn for turn in conversation_turns(data)}
    assert figures["questions"] == len(figures["answer_key"]) == QUESTIONS
    assert figures["scope_sizes"] == {conversation_id: len(turns) + FILLER}
    for question in figures["answer_key"]:
        assert question["category"] != "adversarial"
        assert len(question["evidence"]) == len(question["evidence_memory_ids"]) >= 1
        memories = Memory.objects.in_bulk(question["evidence_memory_ids"])
        for dia_id, memory_id in zip(question["evidence"], question["evidence_memory_ids"], strict=True):
            turn = turns[dia_id]
            memory = memories[memory_id]
            assert memory.content == f"{turn['sender']}: {turn['content']}"
            assert memory.subject == turn["sender"] and memory.source_ref == dia_id
            assert memory.updated_at.isoformat() == turn["created_at"]  # the LoCoMo date, not the load time


def test_default_setting_finds_the_evidence(figures):
    [default] = [result for result in figures["settings"] if result["default"]]
    assert default["name"] == figures["default_setting"]
    assert default["overall"]["questions"] == QUESTIONS
    assert default["overall"]["recall@10"] >= RECALL_AT_10_FLOOR, default["overall"]
    assert default["overall"]["recall@5"] <= default["overall"]["recall@10"] <= default["overall"]["hit@10"]


@pytest.mark.postgres
def test_exhaustive_baseline_scores_every_match(figures):
    names = [result["name"] for result in figures["settings"]]
    assert names == [figures["default_setting"], "exhaustive"]
    default, exhaustive = figures["settings"]
    # Nothing is common in the baseline, so its candidates are a superset of the default's.
    assert exhaustive["common_lexemes"]["26"]["count"] == 0 < default["common_lexemes"]["26"]["count"]
    assert exhaustive["mean_candidates"] > default["mean_candidates"] > 0
    # Measured equal at this size (0.562). Not a law: on the full run some lowered settings
    # beat the baseline (bench/JOURNAL.md), because a candidate matching only common terms can still
    # be lifted into the top 10 by ranking's subject and recency factors.
    assert exhaustive["overall"]["recall@10"] >= default["overall"]["recall@10"]


def test_json_report_has_its_fields(figures, tmp_path):
    path = write_results("memory_relevance", connection.vendor, figures, tmp_path)
    report = json.loads(path.read_text())
    assert report["benchmark"] == "memory_relevance" and report["vendor"] == connection.vendor
    assert report["ks"] == [5, 10] and report["search_limit"] == 10
    for result in report["settings"]:
        overall = result["overall"]
        assert {"recall@5", "recall@10", "hit@5", "hit@10", "mrr"} <= set(overall)
        assert 0 <= overall["mrr"] <= overall["hit@10"] <= 1
        assert result["search"]["count"] == QUESTIONS and result["search"]["p50_ms"] > 0
        assert set(result["by_category"]) <= {"multi-hop", "temporal", "open-domain", "single-hop"}
        assert sum(summary["questions"] for summary in result["by_category"].values()) == QUESTIONS
        if connection.vendor == "postgresql":
            assert result["mean_candidates"] > 0
        else:
            assert result["mean_candidates"] is None


# --- with embeddings (--embeddings) -------------------------------------------------------------

FUSIONS = ["shipped (memories.ranking.fuse)", "vector only", "weighted 0.5/0.5 floor 0.35 (before)"]


@pytest.fixture
def hybrid_figures(conversation, fake_llm):
    """The same small run against the fake OpenAI-compatible server, as bench/embeddings_server.py
    would serve it: the real client embeds every memory and every question."""
    from memories import ranking

    shipped = ranking.fuse
    defaults = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    figures = run(conversations=1, questions_per_conversation=QUESTIONS, filler=FILLER,
                  shares=[defaults[0]], min_docs=[defaults[1]], embeddings=fake_llm.base_url,
                  embedding_model="fake-embedding", fusions=FUSIONS)
    assert ranking.fuse is shipped  # swapped per fusion, put back afterwards
    return figures


def test_embeddings_run_embeds_every_memory_through_the_reembedding_job(hybrid_figures, fake_llm):
    from kinsite.models import LLMCall

    scope = sum(hybrid_figures["scope_sizes"].values())
    assert hybrid_figures["hybrid"]["embedded"]["memories"] == scope
    assert Memory.objects.filter(embedding_model="fake-embedding").count() == scope
    assert not Memory.objects.filter(vector__isnull=True).exists()
    reembed_calls = LLMCall.objects.filter(purpose="memory_reembed")
    assert reembed_calls.count() >= scope / 64 and not reembed_calls.exclude(status="ok").exists()
    # Every question was embedded as a query, once per fusion (the lexical run embeds nothing).
    queries = [body["input"] for body in fake_llm.requests_to("embeddings") if len(body["input"]) == 1]
    questions = [question["question"] for question in hybrid_figures["answer_key"]]
    assert [text for [text] in queries if text in questions] == questions * len(FUSIONS)


def test_embeddings_run_reports_each_fusion_against_lexical_only(hybrid_figures):
    hybrid = hybrid_figures["hybrid"]
    [lexical] = [result for result in hybrid_figures["settings"] if result["default"]]
    assert hybrid["lexical"]["overall"] == lexical["overall"]
    assert [result["name"] for result in hybrid["fusions"]] == FUSIONS
    assert [result["default"] for result in hybrid["fusions"]] == [True, False, False]
    for result in hybrid["fusions"]:
        assert result["overall"]["questions"] == QUESTIONS
        assert result["search"]["count"] == QUESTIONS
        changed = set(result["worse_than_lexical"]) | set(result["better_than_lexical"])
        assert changed <= set(range(QUESTIONS))
        assert not set(result["worse_than_lexical"]) & set(result["better_than_lexical"])
    # Vectors alone rank differently from words: the runs are really of different fusions.
    shipped, vector_only, _ = hybrid["fusions"]
    assert vector_only["worse_than_lexical"] or vector_only["better_than_lexical"]
    assert vector_only["overall"] != shipped["overall"]


def test_several_filler_sizes_grow_the_same_kins(conversation):
    conversation_id, data = conversation
    turns = len(conversation_turns(data))
    defaults = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    figures = run(conversations=1, questions_per_conversation=5, filler=[100, 0],
                  shares=[defaults[0]], min_docs=[defaults[1]])
    assert [size["filler_per_kin"] for size in figures["by_filler"]] == [0, 100]
    assert [size["scope_sizes"] for size in figures["by_filler"]] == [{conversation_id: turns},
                                                                        {conversation_id: turns + 100}]
    # The top-level figures are the largest size's; every size asked every question.
    assert figures["scope_sizes"] == figures["by_filler"][-1]["scope_sizes"]
    assert figures["settings"] == figures["by_filler"][-1]["settings"]
    for size in figures["by_filler"]:
        for result in size["settings"]:
            assert result["overall"]["questions"] == 5
            assert 0 <= result["bm25_list"]["recall@10"] <= result["bm25_list"]["recall@50"] <= 1
