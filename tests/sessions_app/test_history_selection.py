"""History selection (SPEC §4): newest first within the token budget, after the compaction
boundary, newest message always, tool calls and their results kept together."""
from kinsite.tokencount import count_tokens
from sessions_app.prompt.history import HistoryItem, select_history

TEXTS = [
    "Can you help me plan a weekend in Lisbon?",
    "Sure. Do you prefer museums, food or walking tours?",
    "Food mostly, and one museum if it is worth it.",
    "Then start at Time Out Market and see the Gulbenkian on Saturday morning.",
    "Great, what about Sunday?",
]


def message(id: int, text: str, role: str = "user") -> HistoryItem:
    return HistoryItem(id=id, role=role, kind="message", tokens=count_tokens(text))


def conversation() -> list[HistoryItem]:
    return [message(i, text, "user" if i % 2 else "assistant") for i, text in enumerate(TEXTS, start=1)]


def ids(items: list[HistoryItem]) -> list[int]:
    return [item.id for item in items]


def test_everything_fits_a_large_budget_oldest_first():
    items = conversation()
    assert select_history(items, budget_tokens=40_000) == items


def test_newest_messages_that_fit_the_budget_are_kept():
    items = conversation()
    tokens = [count_tokens(text) for text in TEXTS]
    assert all(t > 3 for t in tokens)  # real tiktoken counts, not word counts
    budget = tokens[-1] + tokens[-2] + tokens[-3]
    assert ids(select_history(items, budget_tokens=budget)) == [3, 4, 5]
    assert ids(select_history(items, budget_tokens=budget - 1)) == [4, 5]
    selected = select_history(items, budget_tokens=budget + tokens[1] - 1)
    assert sum(item.tokens for item in selected) <= budget + tokens[1] - 1
    assert ids(selected) == [3, 4, 5]


def test_selection_stops_at_the_first_message_that_does_not_fit():
    items = [message(1, "ok"), message(2, "word " * 200), message(3, "thanks")]
    # Message 1 would fit on its own, but skipping 2 would leave a hole in the history.
    assert ids(select_history(items, budget_tokens=20)) == [3]


def test_newest_message_is_kept_even_alone_over_budget():
    items = [message(1, "hello"), message(2, "please summarise this: " + "lorem ipsum " * 500)]
    assert items[1].tokens > 1000
    assert ids(select_history(items, budget_tokens=100)) == [2]
    assert ids(select_history(items, budget_tokens=0)) == [2]


def test_only_items_after_the_compaction_boundary_are_eligible():
    items = conversation()
    assert ids(select_history(items, budget_tokens=40_000, boundary_id=2)) == [3, 4, 5]
    assert ids(select_history(items, budget_tokens=40_000, boundary_id=5)) == []
    assert select_history([], budget_tokens=100) == []


def tool_exchange(call_id: int, *call_ids: str) -> list[HistoryItem]:
    call = HistoryItem(id=call_id, role="assistant", kind="tool_call", tokens=30, tool_call_ids=call_ids)
    results = [
        HistoryItem(id=call_id + n, role="tool", kind="tool_result", tokens=50, tool_call_id=cid)
        for n, cid in enumerate(call_ids, start=1)
    ]
    return [call, *results]


def test_tool_call_and_results_are_kept_together():
    items = [
        HistoryItem(id=1, role="user", kind="message", tokens=10),
        *tool_exchange(2, "call_a", "call_b"),  # ids 2, 3, 4: 130 tokens
        HistoryItem(id=5, role="assistant", kind="message", tokens=20),
    ]
    assert ids(select_history(items, budget_tokens=150)) == [2, 3, 4, 5]
    assert ids(select_history(items, budget_tokens=160)) == [1, 2, 3, 4, 5]


def test_tool_group_that_does_not_fit_is_dropped_whole_and_selection_stops():
    items = [
        HistoryItem(id=1, role="user", kind="message", tokens=10),
        *tool_exchange(2, "call_a", "call_b"),
        HistoryItem(id=5, role="assistant", kind="message", tokens=20),
    ]
    # 20 + the last result (50) would fit 100, but never a result without its call.
    assert ids(select_history(items, budget_tokens=100)) == [5]
    assert ids(select_history(items, budget_tokens=149)) == [5]


def test_newest_tool_group_is_kept_whole_even_over_budget():
    items = [HistoryItem(id=1, role="user", kind="message", tokens=10), *tool_exchange(2, "call_a")]
    assert ids(select_history(items, budget_tokens=10)) == [2, 3]


def test_result_whose_call_is_before_the_boundary_is_dropped():
    items = [
        HistoryItem(id=1, role="user", kind="message", tokens=10),
        *tool_exchange(2, "call_a"),
        HistoryItem(id=4, role="assistant", kind="message", tokens=20),
    ]
    assert ids(select_history(items, budget_tokens=1000, boundary_id=2)) == [4]


def test_result_after_an_unrelated_message_stays_with_its_call_and_order_is_kept():
    call = tool_exchange(2, "call_a")[0]
    items = [
        HistoryItem(id=1, role="user", kind="message", tokens=10),
        call,
        HistoryItem(id=3, role="user", kind="message", tokens=10),
        HistoryItem(id=4, role="tool", kind="tool_result", tokens=50, tool_call_id="call_a"),
    ]
    assert ids(select_history(items, budget_tokens=1000)) == [1, 2, 3, 4]
    # The newest item is the result, so its group is kept first; message 3 brings the total to exactly 90.
    assert ids(select_history(items, budget_tokens=90)) == [2, 3, 4]
