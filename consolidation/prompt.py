"""The consolidation prompt and the checks on the model's answer: pure functions over plain
data, so they are tested without a database or a model."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from consolidation.models import Fact
from kinsite.llm.replies import strip_json_fence
from kinsite.prompt_safety import guarded, one_line
from kinsite.prompt_templates import template_fields, template_render

KIND = "consolidation"  # the prompt template's kind (kinsite.prompt_templates)
ANSWER_KEYS = ("updated_experience_markdown", "processed_pending_ids", "superseded_fact_ids", "summary_of_changes")
NO_EXPERIENCE = "(empty)"
NO_FACTS = "(none)"


# --- the prompt (pure) -----------------------------------------------------------------------


def fact_line(fact: Fact) -> str:
    """How a fact is shown to the model: id, category, the date it arrived, the statement."""
    # One line, tags escaped: a statement is stored text and must not close the prompt's blocks.
    return f"- [id {fact.pk}] ({fact.category}, {fact.created_at.date().isoformat()}) {one_line(fact.statement)}"


_HEADING_LINE = re.compile(r"^#{1,6}[ \t]+\S")


def canonical_sections(template_body: str) -> list[str]:
    """The headings the experience document must have, in order: the template's heading
    list, i.e. the longest run of Markdown heading lines with only blank lines between them
    (the first on a tie). Headings standing alone elsewhere ("## Rules") structure the
    prompt, not the document. A template without headings imposes no sections."""
    best: list[str] = []
    current: list[str] = []
    for line in template_body.splitlines():
        stripped = line.strip()
        if _HEADING_LINE.match(stripped):
            current.append(_normalise_heading(stripped))
        elif stripped:
            if len(current) > len(best):
                best = current
            current = []
    if len(current) > len(best):
        best = current
    return best


def _normalise_heading(line: str) -> str:
    return " ".join(line.split())


# Data a run cannot do without: appended after a template that has no placeholder for it.
APPENDED_WHEN_MISSING = ("current_experience", "pending_facts")


def render_prompt(*, template_body: str, kin_name: str, max_words: int, current_experience: str,
                  pending: list[Fact], active: list[Fact]) -> str:
    """The consolidation prompt: `template_body` filled in (raises TemplateError). Values are
    stored text, made safe first (kinsite.prompt_safety): the document keeps the headings the
    answer must repeat, but cannot close its block or pose as a role turn. A template
    without {current_experience} or {pending_facts} gets each appended, in the default's
    tags, when it has content: otherwise the facts would stay pending for ever."""
    data = {
        "current_experience": guarded(current_experience.strip(), keep_headings=True),
        "pending_facts": "\n".join(fact_line(fact) for fact in pending),
    }
    prompt = template_render(KIND, template_body, {
        "kin_name": one_line(kin_name),
        "max_words": max_words,
        "current_experience": data["current_experience"] or NO_EXPERIENCE,
        "pending_facts": data["pending_facts"] or NO_FACTS,
        "active_facts": "\n".join(fact_line(fact) for fact in active) or NO_FACTS,
    })
    used = template_fields(KIND, template_body)
    appended = [f"<{name}>\n{data[name]}\n</{name}>" for name in APPENDED_WHEN_MISSING
                if name not in used and data[name]]
    return "\n\n".join([prompt.rstrip("\n"), *appended]) if appended else prompt


def correction_prompt(previous_answer: str, reasons: list[str]) -> str:
    """The corrective retry's message: the answer was rejected, here is why."""
    listed = "\n".join(f"- {reason}" for reason in reasons)
    return (
        "Your answer was rejected because:\n"
        f"{listed}\n\n"
        "Fix every problem and answer again with the complete JSON object (all four keys, "
        "the whole document), nothing else."
    )


# --- validation (pure) -----------------------------------------------------------------------

_HTML_COMMENT = re.compile(r"<!--.*?(-->|$)", re.DOTALL)
# ISO-8601 date-times (a date with a time of day): "when it was learned" stamps. Bare
# dates are kept: "the contract ends 2026-06-30" is knowledge.
_TIMESTAMP_TEXT = r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?(?:Z|UTC|[+-]\d{2}:?\d{2}))?\b"
_TIMESTAMP = re.compile(_TIMESTAMP_TEXT)
# A timestamp alone in its brackets can go without touching the sentence; one inside a
# sentence cannot (cutting "(learned 2026-12-01 10:00)" left "(learned."): answer_validate refuses it.
_BRACKETED_TIMESTAMP = re.compile(rf"\[\s*{_TIMESTAMP_TEXT}\s*\]|\(\s*{_TIMESTAMP_TEXT}\s*\)")
_WORD = re.compile(r"\w+(?:['’\-.]\w+)*")
TIMESTAMP_LINES_SHOWN = 3


def clean_markdown(markdown: str) -> str:
    """The document as stored: HTML comments and timestamps alone in their brackets
    removed, the spaces and blank lines they leave tidied, trailing spaces dropped.
    Any other timestamp stays (answer_validate refuses the answer)."""
    text = _HTML_COMMENT.sub("", markdown.replace("\r\n", "\n"))
    text = _BRACKETED_TIMESTAMP.sub("", text)
    lines = []
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        body = re.sub(r"[ \t]{2,}", " ", line.strip())
        body = re.sub(r"\s+([,.;:])", r"\1", body)
        lines.append((" " * indent + body) if body else "")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _timestamp_errors(markdown: str) -> list[str]:
    lines = [line.strip() for line in markdown.splitlines() if _TIMESTAMP.search(line)]
    if not lines:
        return []
    shown = "; ".join(repr(line) for line in lines[:TIMESTAMP_LINES_SHOWN])
    more = f" (and {len(lines) - TIMESTAMP_LINES_SHOWN} more lines)" if len(lines) > TIMESTAMP_LINES_SHOWN else ""
    return [f"The document has timestamps, which it must not: {shown}{more}. Remove each timestamp together "
            "with the words that only say when something was learned, and keep the rest of the sentence intact."]


def word_count(markdown: str) -> int:
    """Words: runs of letters and digits (joined by ' - . inside a word, so "don't",
    "customer-id" and "v1.2" are one word each). Markdown marks (#, -, *, |) are not words."""
    return len(_WORD.findall(markdown))


@dataclass(frozen=True)
class ConsolidationAnswer:
    markdown: str  # cleaned: as stored
    processed_ids: list[int]
    superseded_ids: list[int]
    summary: str
    word_count: int


def _id_list(value, key: str, errors: list[str]) -> list[int]:
    if not isinstance(value, list) or any(isinstance(item, bool) or not isinstance(item, int) for item in value):
        errors.append(f"{key} must be a list of integer fact ids.")
        return []
    return list(dict.fromkeys(value))  # duplicates are harmless: keep the first of each


def answer_validate(
    raw: str, *, sections: list[str], max_words: int, pending_ids: set[int], active_ids: set[int]
) -> tuple[ConsolidationAnswer | None, list[str]]:
    """Check a model answer; (the answer, []) when valid, else (None, every reason):

    - one JSON object (a ```json fence tolerated) with exactly ANSWER_KEYS, each typed;
    - every processed id is one of `pending_ids` (this kin's facts pending at the run's
      start), unknown and other kins' ids refused alike, and while facts are pending at least
      one is processed (else a new version would apply while the facts stay pending for ever);
    - every superseded id is one of `active_ids` (this kin's active facts shown in the prompt);
    - after clean_markdown: each canonical section heading on its own line exactly once, in
      the template's order (other headings allowed), no timestamp left, at most `max_words`."""
    try:
        data = json.loads(strip_json_fence(raw or ""))
    except ValueError as exc:
        return None, [f"The answer is not valid JSON ({exc})."]
    if not isinstance(data, dict):
        return None, ["The answer must be one JSON object."]
    errors: list[str] = []
    missing = [key for key in ANSWER_KEYS if key not in data]
    extra = sorted(set(data) - set(ANSWER_KEYS))
    if missing:
        errors.append(f"Missing key(s): {', '.join(missing)}.")
    if extra:
        errors.append(f"Unexpected key(s): {', '.join(extra)}; the answer has exactly: {', '.join(ANSWER_KEYS)}.")
    markdown = data.get("updated_experience_markdown")
    summary = data.get("summary_of_changes", "")
    if "updated_experience_markdown" in data and (not isinstance(markdown, str) or not markdown.strip()):
        errors.append("updated_experience_markdown must be a non-empty string.")
        markdown = None
    if not isinstance(summary, str):
        errors.append("summary_of_changes must be a string.")
        summary = ""
    processed = _id_list(data.get("processed_pending_ids", []), "processed_pending_ids", errors)
    superseded = _id_list(data.get("superseded_fact_ids", []), "superseded_fact_ids", errors)
    if pending_ids and isinstance(data.get("processed_pending_ids"), list) and not data["processed_pending_ids"]:
        were = "1 fact was" if len(pending_ids) == 1 else f"{len(pending_ids)} facts were"
        errors.append(f"processed_pending_ids is empty, but {were} pending: list the id of every pending fact "
                      "you considered, whether you folded it in or not.")
    not_pending = [fact_id for fact_id in processed if fact_id not in pending_ids]
    if not_pending:
        errors.append(f"processed_pending_ids has id(s) that are not pending facts of this kin: "
                      f"{', '.join(map(str, not_pending))}.")
    not_active = [fact_id for fact_id in superseded if fact_id not in active_ids]
    if not_active:
        errors.append(f"superseded_fact_ids has id(s) that are not active facts of this kin: "
                      f"{', '.join(map(str, not_active))}.")

    cleaned, words = "", 0
    if isinstance(markdown, str):
        cleaned = clean_markdown(markdown)
        errors.extend(_section_errors(cleaned, sections))
        errors.extend(_timestamp_errors(cleaned))
        words = word_count(cleaned)
        if words > max_words:
            errors.append(f"The document has {words} words; the limit is {max_words}. Make it denser.")
    if errors:
        return None, errors
    return ConsolidationAnswer(markdown=cleaned, processed_ids=processed, superseded_ids=superseded,
                               summary=summary.strip(), word_count=words), []


def _section_errors(markdown: str, sections: list[str]) -> list[str]:
    lines = [_normalise_heading(line) for line in markdown.splitlines()]
    errors, positions = [], []
    for heading in sections:
        found = [index for index, line in enumerate(lines) if line == heading]
        if not found:
            errors.append(f"Missing section heading {heading!r} (write it exactly, on its own line).")
        elif len(found) > 1:
            errors.append(f"Section heading {heading!r} appears {len(found)} times; once only.")
        else:
            positions.append((found[0], heading))
    order = [heading for _, heading in sorted(positions)]
    expected = [heading for heading in sections if heading in order]
    if order != expected:
        errors.append("The sections are out of order; the order is: " + " → ".join(repr(h) for h in sections) + ".")
    return errors
