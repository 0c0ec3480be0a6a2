"""Pure history selection: the newest messages after the compaction boundary that fit a token budget."""
from collections.abc import Sequence
from typing import NamedTuple


class HistoryItem(NamedTuple):
    # A named tuple, not a frozen dataclass: a turn builds one per event of its history
    # window, and a tuple is several times cheaper to make.
    id: int
    role: str
    kind: str
    tokens: int
    # On a tool result: the call it answers. On an assistant tool call: the ids it issued.
    tool_call_id: str | None = None
    tool_call_ids: tuple[str, ...] = ()


def _units(items: Sequence[HistoryItem]) -> list[list[HistoryItem]]:
    """Split items (oldest first) into units that are kept or dropped whole: an assistant
    tool call with its results, or a single item. A result whose call is not among the items is
    dropped, since providers reject a tool result without its call."""
    units: list[list[HistoryItem]] = []
    unit_of_call: dict[str, list[HistoryItem]] = {}
    for item in items:
        if item.tool_call_id is not None and not item.tool_call_ids:
            unit = unit_of_call.get(item.tool_call_id)
            if unit is not None:
                unit.append(item)
            continue
        unit = [item]
        units.append(unit)
        for call_id in item.tool_call_ids:
            unit_of_call[call_id] = unit
    # Order by each unit's newest item, so the walk back from the newest meets units in that order
    # even if a tool result arrived after an unrelated message.
    position = {id(item): index for index, item in enumerate(items)}
    return sorted(units, key=lambda unit: position[id(unit[-1])])


def select_history(
    items: Sequence[HistoryItem], *, budget_tokens: int, boundary_id: int | None = None
) -> list[HistoryItem]:
    """Walk back from the newest unit while the running total fits `budget_tokens`, and stop
    at the first unit that does not, so the kept history is one unbroken stretch. The newest
    unit is kept even when it alone is over budget. Items come and go oldest first."""
    eligible = list(items) if boundary_id is None else [item for item in items if item.id > boundary_id]
    if not any(item.tool_call_id is not None or item.tool_call_ids for item in eligible):
        # Fast path, the common case: no tool events, so every item is a unit of its own.
        return _newest_that_fit(eligible, budget_tokens)
    kept: list[list[HistoryItem]] = []
    total = 0
    for unit in reversed(_units(eligible)):
        unit_tokens = sum(item.tokens for item in unit)
        if kept and total + unit_tokens > budget_tokens:
            break
        kept.append(unit)
        total += unit_tokens
    # Filter rather than flatten the units, so items keep their original order.
    kept_ids = {id(item) for unit in kept for item in unit}
    return [item for item in eligible if id(item) in kept_ids]


def _newest_that_fit(items: list[HistoryItem], budget_tokens: int) -> list[HistoryItem]:
    """select_history when each item is a unit of its own: the same walk back, without
    building the units."""
    total = 0
    start = len(items)
    while start > 0:
        tokens = items[start - 1].tokens
        if start < len(items) and total + tokens > budget_tokens:
            break
        total += tokens
        start -= 1
    return items[start:]
