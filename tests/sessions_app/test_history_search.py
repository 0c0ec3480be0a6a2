"""History search over a session or all of a kin's sessions: ranked, scoped, and
safe against any query text (full-text syntax is never passed through)."""
from datetime import UTC, datetime

import pytest

from sessions_app.models import Event
from sessions_app.selectors import rank_with_neighbours
from tests.factories import KinFactory, MessageFactory, SessionFactory
from tests.sessions_app.test_api_access import assert_api_error

FILLER = [
    "we should book the train tickets soon",
    "the weather was lovely at the beach",
    "my sister started a new job in march",
    "I finally finished reading that novel",
    "the kids loved the museum visit",
    "dinner was pasta with fresh basil",
    "let us meet on friday afternoon",
    "the garden needs watering every day",
    "I adopted a puppy from the shelter",
    "our team won the football match",
]


def session_search(client, session, query: str, **params):
    return client.get(f"/api/v1/sessions/{session.pk}/history/search/", {"q": query, **params})


def kin_search(client, kin, query: str, **params):
    return client.get(f"/api/v1/kins/{kin.pk}/history/search/", {"q": query, **params})


def hit_ids(response) -> list[str]:
    assert response.status_code == 200, response.content[:500]
    return [hit["external_id"] for hit in response.json()["results"]]


def add_messages(session, contents: list[str], *, prefix: str) -> list[Event]:
    return [
        MessageFactory(session=session, content=content, external_id=f"{prefix}{i}")
        for i, content in enumerate(contents)
    ]


# --- results and ranking --------------------------------------------------------------


def test_hits_carry_id_external_id_sender_time_content_and_score(api_client, chat_session):
    add_messages(chat_session, FILLER, prefix="f")
    event = MessageFactory(
        session=chat_session,
        content="We booked the lighthouse tour for June",
        sender="Caroline",
        external_id="D4:2",
        created_at=datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
    )

    response = session_search(api_client, chat_session, "lighthouse tour")

    assert response.status_code == 200
    [hit] = response.json()["results"]
    assert {"id", "external_id", "sender", "created_at", "content", "score"} <= set(hit)
    assert hit["id"] == event.pk
    assert hit["external_id"] == "D4:2"
    assert hit["sender"] == "Caroline"
    assert hit["created_at"] == "2023-05-08T13:56:00Z"
    assert hit["content"] == event.content
    assert isinstance(hit["score"], float) and hit["score"] > 0


def test_message_matching_more_query_words_ranks_first(api_client, chat_session):
    add_messages(chat_session, FILLER, prefix="f")
    add_messages(
        chat_session,
        [
            "we talked about the bicycle for a while today",
            "we talked about the bicycle basket for a while",
            "we talked about the red bicycle basket a while",
        ],
        prefix="b",
    )

    response = session_search(api_client, chat_session, "red bicycle basket")

    assert hit_ids(response) == ["b2", "b1", "b0"]
    scores = [hit["score"] for hit in response.json()["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[1] > scores[2]


def test_message_matching_a_rarer_query_word_ranks_first(api_client, chat_session):
    add_messages(chat_session, FILLER, prefix="f")
    add_messages(chat_session, [f"had coffee with friend number {n}" for n in range(8)], prefix="c")
    # Same length as the coffee messages and written later, so only word rarity can put it first.
    rare = MessageFactory(session=chat_session, content="saw a zeppelin with friend number 9", external_id="z")

    response = session_search(api_client, chat_session, "coffee zeppelin")

    assert hit_ids(response)[0] == rare.external_id
    assert len(response.json()["results"]) == 9


def test_stemming_matches_other_word_forms(api_client, chat_session):
    add_messages(chat_session, FILLER, prefix="f")
    MessageFactory(session=chat_session, content="She runs every morning before work", external_id="run")

    assert hit_ids(session_search(api_client, chat_session, "running")) == ["run"]
    assert hit_ids(session_search(api_client, chat_session, "RUN")) == ["run"]


def test_search_matches_sender_name(api_client, chat_session):
    MessageFactory(session=chat_session, sender="Gwendolyn", content="see you tomorrow", external_id="g")
    MessageFactory(session=chat_session, sender="Maria", content="sure, tomorrow works", external_id="m")

    assert hit_ids(session_search(api_client, chat_session, "gwendolyn")) == ["g"]


def test_search_skips_events_that_are_not_messages(api_client, chat_session):
    MessageFactory(session=chat_session, content="the zeppelin plan", external_id="msg")
    MessageFactory(session=chat_session, kind=Event.Kind.TOOL_CALL, content="zeppelin tool call", external_id="tool")

    assert hit_ids(session_search(api_client, chat_session, "zeppelin")) == ["msg"]


def test_limit_caps_the_number_of_hits(api_client, chat_session):
    add_messages(chat_session, [f"zeppelin sighting {n}" for n in range(15)], prefix="z")

    assert len(hit_ids(session_search(api_client, chat_session, "zeppelin"))) == 10  # SEARCH_DEFAULT_LIMIT
    assert len(hit_ids(session_search(api_client, chat_session, "zeppelin", limit=3))) == 3
    assert len(hit_ids(session_search(api_client, chat_session, "zeppelin", limit=100))) == 15


# --- neighbouring messages as context -------------------------------------------------


def test_rank_with_neighbours_adds_half_the_better_neighbour_score():
    rows = [(1, 2.0, None, None), (2, 1.0, 3.0, 0.5), (3, 1.0, None, 1.0)]

    assert rank_with_neighbours(rows) == [(2, 2.5), (1, 2.0), (3, 1.5)]


def test_message_next_to_a_match_of_another_query_word_ranks_first(api_client, chat_session):
    add_messages(chat_session, FILLER[:5], prefix="f")
    # Written first and as long as the answer, so without context it would win the tie.
    MessageFactory(session=chat_session, content="the adoption papers arrived", external_id="lone")
    add_messages(chat_session, FILLER[5:], prefix="g")
    MessageFactory(session=chat_session, sender="Melanie", content="what did you research lately", external_id="q")
    MessageFactory(session=chat_session, sender="Caroline", content="adoption agencies mostly", external_id="a")

    ids = hit_ids(session_search(api_client, chat_session, "research adoption"))

    assert ids.index("a") < ids.index("lone")
    assert "q" in ids
    assert "g4" not in ids  # context ranks matches; a non-matching neighbour is no hit


def at(minute: int) -> datetime:
    return datetime(2023, 5, 8, 13, minute, tzinfo=UTC)


def test_neighbours_follow_time_order_within_the_session(api_client, chat_session):
    MessageFactory(session=chat_session, content="the adoption papers arrived", created_at=at(40), external_id="lone")
    MessageFactory(session=chat_session, content="adoption agencies mostly", created_at=at(10), external_id="a")
    MessageFactory(session=chat_session, content="see you soon", created_at=at(30), external_id="x")
    # Stored last but said just before the answer, with a tool call in between: still its neighbour.
    MessageFactory(session=chat_session, content="what did you research", created_at=at(5), external_id="q")
    MessageFactory(session=chat_session, kind=Event.Kind.TOOL_CALL, content="lookup", created_at=at(7))
    # The same words in another session are no one's neighbour here.
    MessageFactory(session=SessionFactory(kin=chat_session.kin), content="research research", created_at=at(2))

    ids = hit_ids(session_search(api_client, chat_session, "research adoption"))

    assert ids.index("a") < ids.index("lone")


def test_neighbour_with_the_same_time_is_ordered_by_id(api_client, chat_session):
    same = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)
    MessageFactory(session=chat_session, content="the adoption papers arrived", created_at=same, external_id="lone")
    MessageFactory(session=chat_session, content="see you soon", created_at=same, external_id="x")
    MessageFactory(session=chat_session, content="what did you research", created_at=same, external_id="q")
    MessageFactory(session=chat_session, content="adoption agencies mostly", created_at=same, external_id="a")

    ids = hit_ids(session_search(api_client, chat_session, "research adoption"))

    assert ids.index("a") < ids.index("lone")


def test_smaller_limit_returns_a_prefix_of_a_larger_one(api_client, chat_session):
    add_messages(chat_session, FILLER, prefix="f")
    add_messages(chat_session, [f"zeppelin {n} and lantern {n % 3}" for n in range(12)], prefix="z")

    full = hit_ids(session_search(api_client, chat_session, "zeppelin lantern 2", limit=100))

    for limit in (1, 3, 10):
        assert hit_ids(session_search(api_client, chat_session, "zeppelin lantern 2", limit=limit)) == full[:limit]


# --- scope ----------------------------------------------------------------------------


@pytest.fixture
def scoped(team, other_team, kin, chat_session):
    """The word 'zeppelin' in two sessions of `kin`, another kin of the team and another team's kin."""
    second_session = SessionFactory(kin=kin)
    sibling_kin = KinFactory(team=team)
    foreign_kin = KinFactory(team=other_team)
    MessageFactory(session=chat_session, content="zeppelin in the first session", external_id="s1")
    MessageFactory(session=second_session, content="zeppelin in the second session", external_id="s2")
    MessageFactory(session=SessionFactory(kin=sibling_kin), content="zeppelin of a sibling kin", external_id="sib")
    MessageFactory(session=SessionFactory(kin=foreign_kin), content="zeppelin of another team", external_id="for")
    return {"second_session": second_session, "sibling_kin": sibling_kin}


def test_session_search_sees_only_its_session(api_client, chat_session, scoped):
    assert hit_ids(session_search(api_client, chat_session, "zeppelin")) == ["s1"]
    assert hit_ids(session_search(api_client, scoped["second_session"], "zeppelin")) == ["s2"]


def test_kin_search_sees_all_its_sessions_and_no_other_kins(api_client, kin, scoped):
    assert sorted(hit_ids(kin_search(api_client, kin, "zeppelin"))) == ["s1", "s2"]
    assert hit_ids(kin_search(api_client, scoped["sibling_kin"], "zeppelin")) == ["sib"]


# --- hostile and odd input ------------------------------------------------------------

OK, BAD = 200, 400
ODD_QUERIES = [
    pytest.param('"foo AND (', OK, id="unbalanced-quote-and-paren"),
    pytest.param("*", OK, id="star"),
    pytest.param("foo*", OK, id="prefix-star"),
    pytest.param("NEAR(", OK, id="near"),
    pytest.param('"', OK, id="quote"),
    pytest.param("OR", OK, id="or"),
    pytest.param("AND OR NOT", OK, id="only-operators"),
    pytest.param("zeppelin:* & !foo | <->", OK, id="tsquery-syntax"),
    pytest.param("content:zeppelin ^zeppelin -zeppelin", OK, id="fts5-column-syntax"),
    pytest.param("", OK, id="empty"),
    pytest.param("   ", OK, id="blank"),
    pytest.param("🎈🚀🎉", OK, id="emoji-only"),
    pytest.param("'; DROP TABLE sessions_app_event; --", OK, id="sql"),
    pytest.param("zeppelin') OR 1=1 --", OK, id="sql-or"),
    pytest.param("_ __ ___", OK, id="underscores"),
    pytest.param("the and of", OK, id="stop-words-only"),
    pytest.param("x" * 3000, OK, id="one-huge-word"),
    pytest.param(" ".join(f"w{n}" for n in range(500)), OK, id="500-words"),
    pytest.param("zeppelin \u0000", BAD, id="nul-byte"),
]


def _query_of_length(length: int) -> str:
    query = ("zeppelin lantern " * (length // 17 + 1))[:length]
    query = query[:-1] + "x"  # no trailing space, which would be trimmed
    assert len(query) == length
    return query


@pytest.fixture(params=["session", "kin"])
def search(request, api_client, chat_session):
    """Runs a search in either scope, over a session holding a few messages."""
    add_messages(chat_session, FILLER + ["zeppelin over the lantern festival"], prefix="f")
    if request.param == "session":
        return lambda query, **params: session_search(api_client, chat_session, query, **params)
    return lambda query, **params: kin_search(api_client, chat_session.kin, query, **params)


@pytest.mark.parametrize("query, status", ODD_QUERIES)
def test_odd_query_text_never_fails(search, query, status):
    response = search(query)

    if status == OK:
        assert response.status_code == 200, response.content[:500]
        assert isinstance(response.json()["results"], list)
    else:
        assert_api_error(response, 400)
    assert Event.objects.count() == len(FILLER) + 1


def test_sql_in_query_is_just_words(search):
    search("'; DROP TABLE sessions_app_event; --")

    assert hit_ids(search("zeppelin")) == ["f10"]


def test_operators_are_treated_as_words(search):
    assert hit_ids(search('"zeppelin AND (')) == ["f10"]
    assert hit_ids(search("NOT zeppelin")) == ["f10"]


def test_empty_query_finds_nothing(search):
    assert hit_ids(search("")) == []


def test_query_of_5000_characters_is_accepted(search):
    assert "f10" in hit_ids(search(_query_of_length(5000)))


def test_query_of_5001_characters_answers_400(search):
    error = assert_api_error(search(_query_of_length(5001)), 400)

    assert "q" in error["details"]


def test_missing_query_answers_400(api_client, chat_session):
    error = assert_api_error(api_client.get(f"/api/v1/sessions/{chat_session.pk}/history/search/"), 400)

    assert "q" in error["details"]


@pytest.mark.parametrize(
    "limit, status",
    [("0", BAD), ("-1", BAD), ("abc", BAD), ("1.5", BAD), ("101", BAD), ("", OK), ("1", OK), ("100", OK)],
)
def test_limit_is_validated(search, limit, status):
    response = search("zeppelin", limit=limit)

    # An empty limit (`?limit=`) means the default.
    if status == OK:
        assert hit_ids(response) == ["f10"]
    else:
        assert "limit" in assert_api_error(response, 400)["details"]


# --- bounded reads per term (PostgreSQL) -----------------------------------------------


@pytest.fixture
def few_candidates(monkeypatch):
    """At most two postings read per query term, so a sender of most of a few messages
    has more postings than are read (as a speaker's name has at 100,000 messages)."""
    from sessions_app import selectors

    monkeypatch.setattr(selectors, "TERM_CANDIDATES", 2)


def add_caroline_chat(session) -> None:
    """Thirteen messages, eleven of them sent by Caroline (so 'carolin' is common), with a
    zeppelin message from each speaker, written apart from each other."""
    add_messages(session, FILLER[:5], prefix="f")
    MessageFactory(session=session, sender="Caroline", content="the zeppelin flew over the harbour", external_id="zc")
    add_messages(session, FILLER[5:], prefix="g")
    MessageFactory(session=session, sender="Melanie", content="the zeppelin flew over the harbour", external_id="zm")
    MessageFactory(session=session, sender="Melanie", content="see you at the station", external_id="m")
    Event.objects.filter(session=session, external_id__regex=r"^[fg]").update(sender="Caroline")


@pytest.mark.postgres
def test_term_with_more_postings_than_are_read_still_scores(api_client, chat_session, few_candidates):
    add_caroline_chat(chat_session)

    response = session_search(api_client, chat_session, "Caroline zeppelin")

    # Both zeppelin messages are found through 'zeppelin'; Caroline's ranks first because
    # 'carolin' still scores it, although only two of its eleven postings were read.
    assert hit_ids(response)[:2] == ["zc", "zm"]
    scores = [hit["score"] for hit in response.json()["results"]]
    assert scores[0] > scores[1]


@pytest.mark.postgres
def test_common_term_alone_finds_only_its_best_postings(api_client, chat_session, few_candidates):
    add_caroline_chat(chat_session)
    # 'carolin' has the same tf on each of Caroline's messages, so its two highest impacts
    # are on her two shortest messages: "ok" (2 lexemes with her name) and zc (4; the
    # others have 5 or 6). Only those two are read, so only they can be hits.
    MessageFactory(session=chat_session, sender="Caroline", content="ok", external_id="short")

    ids = hit_ids(session_search(api_client, chat_session, "Caroline", limit=100))

    assert sorted(ids) == ["short", "zc"]


@pytest.mark.postgres
def test_without_a_cap_every_match_is_a_hit(api_client, chat_session):
    # The default cap (1,000 postings per term) is far above a small session: every matching message is scored.
    add_caroline_chat(chat_session)

    ids = hit_ids(session_search(api_client, chat_session, "Caroline zeppelin", limit=100))

    assert ids[:2] == ["zc", "zm"]
    assert len(ids) == 12  # both zeppelin messages and Caroline's ten others


@pytest.mark.postgres
def test_capped_term_gets_its_document_frequency_from_the_sample(chat_session, monkeypatch):
    """A term whose postings were not all read counts as frequent as the scope's sample
    says. Here the sample is the whole session, so the scores equal those of reading
    every posting; taking the two postings read as the frequency would make 'carolin'
    rarer (on 2 of 13 messages instead of 11) and raise zc's score."""
    from sessions_app import selectors

    add_caroline_chat(chat_session)
    exact = {hit.external_id: hit.score for hit in selectors.history_search(
        query="Caroline zeppelin", limit=10, session=chat_session)}
    monkeypatch.setattr(selectors, "TERM_CANDIDATES", 2)

    capped = {hit.external_id: hit.score for hit in selectors.history_search(
        query="Caroline zeppelin", limit=10, session=chat_session)}

    assert capped["zc"] == pytest.approx(exact["zc"]) and capped["zm"] == pytest.approx(exact["zm"])


@pytest.mark.postgres
def test_candidate_missing_a_capped_posting_is_rescored_and_one_holding_all_keeps_its_score(chat_session, monkeypatch):
    """With five postings read per term, 'carolin' (on 13 messages) is capped, 'zeppelin'
    and 'harbour' (on 4) are not. A candidate whose postings read include every capped
    term scores as read ("short"); one whose 'carolin' posting was not read ("long": its
    length puts it last) is rescored from all its postings. Either way each hit scores as
    when every posting is read."""
    from sessions_app import selectors

    add_caroline_chat(chat_session)
    MessageFactory(session=chat_session, sender="Caroline", content="zeppelin harbour", external_id="short")
    MessageFactory(session=chat_session, sender="Caroline", external_id="long",
                   content="the harbour pilot guided every ship past the old lighthouse at dawn today")
    query = "Caroline zeppelin harbour"
    exact = {hit.external_id: hit.score
             for hit in selectors.history_search(query=query, limit=100, session=chat_session)}
    monkeypatch.setattr(selectors, "TERM_CANDIDATES", 5)

    capped = {hit.external_id: hit.score
              for hit in selectors.history_search(query=query, limit=100, session=chat_session)}

    assert {"short", "long", "zc", "zm"} <= set(capped)
    assert capped == pytest.approx({key: exact[key] for key in capped})


@pytest.mark.postgres
def test_search_takes_one_query(chat_session, django_assert_num_queries):
    from sessions_app.selectors import history_search

    add_caroline_chat(chat_session)
    for query in ("Caroline zeppelin", "zeppelin", "Caroline", "harbour station"):
        with django_assert_num_queries(1):  # the search returns the hits' rows
            hits = history_search(query=query, limit=10, session=chat_session)
        assert hits and all(hit.content and hit.created_at and hit.score > 0 for hit in hits)


@pytest.mark.postgres
def test_kin_search_reads_the_best_postings_over_all_its_sessions(api_client, kin, chat_session, few_candidates):
    # 'zeppelin' once on each message, so the shorter the message the higher its impact:
    # z1 (2 lexemes with the sender's name), c1 (3), c0 (4), c2 (5).
    other = SessionFactory(kin=kin)
    MessageFactory(session=other, sender="Al", content="zeppelin", external_id="z1")
    add_messages(chat_session, ["the zeppelin flew over the harbour", "zeppelin again",
                                "a zeppelin over the grey northern sea"], prefix="c")
    MessageFactory(session=SessionFactory(), sender="Al", content="zeppelin", external_id="elsewhere")

    # The two best postings of the kin, one from each of its sessions; of the session, its two best.
    assert sorted(hit_ids(kin_search(api_client, kin, "zeppelin"))) == ["c1", "z1"]
    assert sorted(hit_ids(session_search(api_client, chat_session, "zeppelin"))) == ["c0", "c1"]
