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
    # beat the baseline (README), because a candidate matching only common terms can still
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
