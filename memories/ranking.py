"""Memory ranking and sameness as pure functions over plain data: memories.search reads
the database once and hands these functions dataclasses.

Final score of a candidate (every factor is documented where its constant is):

    relevance = weighted mean of the signals the candidate has (fuse):
                  text   = BM25 / best BM25 among the candidates                            (0..1)
                  vector = (cosine - VECTOR_FLOOR)
                           / max(best cosine among them - VECTOR_FLOOR, VECTOR_MIN_SPREAD)   (0..1)
    score     = relevance × importance × recency × subject

A candidate with neither a text match nor a vector above the floor is dropped, and so
is any candidate scoring below RELATIVE_CUTOFF × the best score.
"""
from __future__ import annotations

import math
import re
import struct
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from kinsite.textsearch import STOP_WORDS

# --- constants (why each value) ---------------------------------------------------------------

# Text and vector signals weigh the same: BM25 is precise on names and rare words, vectors
# catch rewordings. Each is scaled by the best candidate's, so both span 0..1 whatever the
# embedder's range (a fixed scale never let MiniLM's vectors weigh as much as the words).
TEXT_WEIGHT = 0.5
VECTOR_WEIGHT = 0.5
# Cosine at or below which a vector says "unrelated" (signal 0): modern embedders give
# unrelated short sentences 0.0–0.2; older ones (ada-002, ~0.7) would need a higher floor.
VECTOR_FLOOR = 0.2
# The vector signal's scale never drops below this spread above the floor: when nothing is
# near (best cosine 0.21), the nearest unrelated memory gets 0.01 / 0.3, not a full 1.0 that
# would tie the best word match. Real matches (MiniLM: 0.5 or more) keep the full scaling.
VECTOR_MIN_SPREAD = 0.3
# Importance 1..10 maps to 0.55..1.0: a 10 outranks a 1 of equal relevance by ~1.8×,
# enough to reorder near-ties without letting an important but off-topic memory win.
IMPORTANCE_BASE = 0.5
# Recency never drops below this share, so an old memory that is the only good match
# still surfaces; between it and 1 the share halves every half-life of the category.
RECENCY_FLOOR = 0.2
DEFAULT_HALF_LIFE_DAYS = 365.0
# A memory whose subject is fully named in the query scores 1.5× (partly named: less).
SUBJECT_BOOST = 0.5
# Hits scoring below this share of the best hit are noise next to it: dropped.
RELATIVE_CUTOFF = 0.2

# Duplicates ("same meaning, not only same text"), lexically: Jaccard of the term sets. At
# 0.8 a word added to four content words still merges, one swapped word of a short sentence
# ("likes tea" / "likes coffee") does not; synonyms are the vector rule's. A wrong merge loses
# a fact from search, a missed one leaves two rows for consolidation: we err towards not merging.
DUPLICATE_MIN_JACCARD = 0.8
# Vector rule: paraphrases of one statement score ~0.9–0.98 with current embedders,
# related-but-different statements about the same person or topic mostly 0.75–0.9.
DUPLICATE_MIN_COSINE = 0.93
# Words that flip or order what a statement says ("is not vegan", "before / after the
# deploy"): texts differing in one are different memories, and embedders barely see a "not".
# Kept even as stop words; a needless one only costs a missed merge. "n't", "cannot": "not".
MEANING_WORDS = frozenset(
    """
    not no nor never neither none nobody nothing nowhere without
    before after until
    above below
    more less most least fewer
    """.split()
)


# --- terms ----------------------------------------------------------------------------------

_DOUBLE_END = re.compile(r"([b-df-hj-np-tv-z])\1$")


@lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """A light English suffix stripper. It only has to send inflections of one word to
    one key consistently (prefers/preferred → prefer, answers → answer), not be Porter."""
    if word.isdigit() or len(word) <= 3:
        return word
    for suffix, replacement, min_len in (
        ("ies", "y", 5), ("sses", "ss", 5), ("ing", "", 6), ("ed", "", 5), ("ly", "", 5),
    ):
        if word.endswith(suffix) and len(word) >= min_len:
            word = word[: -len(suffix)] + replacement
            break
    else:
        if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
            word = word[:-1]
    word = _DOUBLE_END.sub(r"\1", word)
    while word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def _tokens(text: str) -> list[str]:
    """The words of `text` in any script and its symbols, lowercase. A word is a run of
    letters, digits and combining marks (a decomposed "é" stays one word); any other visible
    non-punctuation character (✅, €) is a token; punctuation, spaces, controls and format
    characters only separate. Unlike query_terms nothing is capped: long texts still differ."""
    tokens: list[str] = []
    word: list[str] = []
    for char in unicodedata.normalize("NFKC", text).casefold():
        category = unicodedata.category(char)
        if char.isalnum() or char == "_" or (category[0] == "M" and word):
            word.append(char)
            continue
        if word:
            tokens.append("".join(word))
            word = []
        if category[0] not in "PZM" and category not in ("Cc", "Cf"):
            tokens.append(char)
    if word:
        tokens.append("".join(word))
    return tokens


# "doesn't" → "does not", so it compares equal to the spelled-out form; the irregular
# contractions first, so "can't" is "can not" (as "cannot" is), not a word "ca".
_IRREGULAR_NT = re.compile(r"\b(ca|wo|sha)n['\u2019]t\b", re.IGNORECASE)
_IRREGULAR_NT_STEMS = {"ca": "can", "wo": "will", "sha": "shall"}
_NT = re.compile(r"n['\u2019]t\b", re.IGNORECASE)


def _expand_negations(text: str) -> str:
    text = _IRREGULAR_NT.sub(lambda m: f"{_IRREGULAR_NT_STEMS[m[1].lower()]} not", text)
    text = _NT.sub(" not", text)
    return re.sub(r"\bcannot\b", "can not", text, flags=re.IGNORECASE)


def term_set(text: str) -> frozenset[str]:
    """The stemmed, stop-word-free terms of `text` (see _tokens), plus its MEANING_WORDS
    unstemmed. Single ASCII letters ("Maria's" gives "maria" and "s") are dropped; single
    digits and other scripts' letters are not ("host 1" vs "host 2")."""
    terms = set()
    for token in _tokens(_expand_negations(text)):
        if token in MEANING_WORDS:
            terms.add(token)
        elif (token not in STOP_WORDS and token.strip("_")
              and not (len(token) == 1 and token.isascii() and token.isalpha())):
            terms.add(stem(token))
    return frozenset(terms)


def _numbers(terms: frozenset[str]) -> frozenset[str]:
    return frozenset(term for term in terms if any(char.isdigit() for char in term))


def _meaning_words(terms: frozenset[str]) -> frozenset[str]:
    return terms & MEANING_WORDS


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


# --- vectors --------------------------------------------------------------------------------


def vector_to_bytes(vector: Iterable[float]) -> bytes:
    values = list(vector)
    return struct.pack(f"<{len(values)}f", *values)


def vector_from_bytes(data: bytes | memoryview | None) -> tuple[float, ...] | None:
    if not data:
        return None
    data = bytes(data)
    if len(data) % 4:
        return None
    return struct.unpack(f"<{len(data) // 4}f", data)


def cosine(a: Iterable[float], b: Iterable[float]) -> float:
    a, b = list(a), list(b)
    if not a or len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


# --- values: what a near-miss changes -------------------------------------------------------

# Spelled numbers and ordinals are values ("two" / "three kids", "first" / "second draft"),
# and so are words that place an event in time ("next" / "last month" are two events).
NUMBER_WORDS = frozenset((  # noqa: SIM905
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion dozen first second third fourth fifth sixth seventh eighth ninth tenth"
).split())
TIME_WORDS = frozenset(["yesterday", "today", "tonight", "tomorrow", "next", "last", "ago", "previous", "upcoming"])
# Abbreviations whose period does not end a sentence ("Dr. Smith").
ABBREVIATIONS = frozenset(["dr", "mr", "mrs", "ms", "st", "prof", "jr", "sr", "vs", "etc"])
_WORD = re.compile(r"[^\W_]+")


def value_tokens(text: str, time_words: bool = True) -> frozenset[str]:
    """The values a statement names, casefolded: a word with a digit ("3pm", "Q3"), a spelled
    number or ordinal, a time word (with time_words), and, past a sentence's first word, a
    single capital letter ("option A") or a capitalised word (a name, day, month, place).
    Embedders see "Option A is chosen" and "Option B is chosen" as near-identical."""
    values = set()
    previous, previous_end = None, 0
    for match in _WORD.finditer(text):
        word = match.group()
        # What stands between this word and the one before (one pass: texts run to 10,000 characters).
        gap = text[previous_end:match.start()].rstrip()
        sentence_start = ((previous is None and not gap) or gap[-1:] in ("!", "?", ":", ";")
                          or (gap[-1:] == "." and (previous is None or previous.casefold() not in ABBREVIATIONS)))
        folded = word.casefold()
        numeric = (any(char.isdigit() for char in word) or folded in NUMBER_WORDS
                   or (time_words and folded in TIME_WORDS))
        if numeric or (not sentence_start and word[0].isupper() and word != "I"):
            values.add(folded)
        previous, previous_end = word, match.end()
    return frozenset(values)


def values_differ(a: str, b: str, time_words: bool = True) -> bool:
    """Whether one text names a value the other does not contain at all, as a value or as any
    word (stemmed: "Saturdays" is "Saturday", and the other may name it first)."""
    stems_a = frozenset(stem(word.casefold()) for word in _WORD.findall(a))
    stems_b = frozenset(stem(word.casefold()) for word in _WORD.findall(b))
    return (any(stem(value) not in stems_b for value in value_tokens(a, time_words))
            or any(stem(value) not in stems_a for value in value_tokens(b, time_words)))


def is_duplicate(
    *,
    new_terms: frozenset[str],
    old_terms: frozenset[str],
    new_subject: str,
    old_subject: str,
    vector_similarity: float | None = None,
    new_text: str = "",
    old_text: str = "",
) -> bool:
    """Same meaning: two set subjects that differ rule it out, and so do two different sets
    of numbers ("at 3pm" / "at 5pm": embedders barely see digits), a value one text names and
    the other lacks (values_differ, given the texts) and any difference in MEANING_WORDS (a
    negation added or dropped is a change); then either rule suffices."""
    if new_subject.strip() and old_subject.strip() and new_subject.strip().casefold() != old_subject.strip().casefold():
        return False
    if new_text and old_text and values_differ(new_text, old_text):
        return False
    new_numbers, old_numbers = _numbers(new_terms), _numbers(old_terms)
    if new_numbers and old_numbers and new_numbers != old_numbers:
        return False
    if _meaning_words(new_terms) != _meaning_words(old_terms):
        return False
    if new_terms and jaccard(new_terms, old_terms) >= DUPLICATE_MIN_JACCARD:
        return True
    return vector_similarity is not None and vector_similarity >= DUPLICATE_MIN_COSINE


# --- ranking --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One memory as the ranker sees it. text_score: BM25 (0 = no text match);
    vector_similarity: cosine with the query, None when either side has no vector."""

    id: int
    text_score: float
    vector_similarity: float | None
    importance: int
    category: str
    updated_at: datetime
    subject: str = ""


@dataclass(frozen=True)
class Ranked:
    id: int
    score: float
    text: float
    vector: float
    importance: float
    recency: float
    subject: float

    def components(self) -> dict[str, float]:
        return {
            "text": self.text,
            "vector": self.vector,
            "importance": self.importance,
            "recency": self.recency,
            "subject": self.subject,
        }


def importance_factor(importance: int) -> float:
    importance = min(max(int(importance), 1), 10)
    return IMPORTANCE_BASE + (1 - IMPORTANCE_BASE) * importance / 10


def recency_factor(*, category: str, updated_at: datetime, now: datetime,
                   half_life_days: Mapping[str, float]) -> float:
    half_life = half_life_days.get(category) or DEFAULT_HALF_LIFE_DAYS
    age_days = max((now - updated_at).total_seconds() / 86400, 0.0)
    return RECENCY_FLOOR + (1 - RECENCY_FLOOR) * 0.5 ** (age_days / half_life)


@lru_cache(maxsize=4_096)
def _subject_terms(subject: str) -> frozenset[str]:
    # Subjects repeat (a person, a project), and a search ranks up to 50 candidates.
    return term_set(subject)


def subject_factor(*, subject: str, query: frozenset[str]) -> float:
    subject_terms = _subject_terms(subject)
    if not subject_terms or not query:
        return 1.0
    return 1 + SUBJECT_BOOST * len(subject_terms & query) / len(subject_terms)


@dataclass(frozen=True)
class Relevance:
    """How well one candidate matches the query (value; 0 = not at all), and the text and
    vector signals it was made of (shown as the hit's components)."""

    value: float
    text: float
    vector: float


def fuse(candidates: list[Candidate]) -> dict[int, Relevance]:
    """The relevance of each candidate: the weighted mean of its text and vector signals, each
    scaled by the best candidate's (module doc). A candidate without a vector (older, or by
    another model) is judged on its words alone, not as a vector miss."""
    best_text = max((c.text_score for c in candidates), default=0.0)
    best_vector = max((c.vector_similarity for c in candidates if c.vector_similarity is not None), default=0.0)
    fused = {}
    for c in candidates:
        text = c.text_score / best_text if best_text > 0 and c.text_score > 0 else 0.0
        weights = TEXT_WEIGHT
        relevance = TEXT_WEIGHT * text
        vector = 0.0
        if c.vector_similarity is not None:
            spread = max(best_vector - VECTOR_FLOOR, VECTOR_MIN_SPREAD)
            vector = max((c.vector_similarity - VECTOR_FLOOR) / spread, 0.0)
            weights += VECTOR_WEIGHT
            relevance += VECTOR_WEIGHT * vector
        fused[c.id] = Relevance(value=relevance / weights, text=text, vector=vector)
    return fused


def rank(
    candidates: Iterable[Candidate],
    *,
    query: str,
    now: datetime,
    half_life_days: Mapping[str, float],
    limit: int,
    relative_cutoff: float = RELATIVE_CUTOFF,
) -> list[Ranked]:
    """The best `limit` candidates, best first, after the cut-offs (see the module doc)."""
    candidates = list(candidates)
    relevances = fuse(candidates)
    query_set = term_set(query)
    ranked = []
    for c in candidates:
        relevance = relevances[c.id]
        if relevance.value <= 0:
            continue  # neither the words nor the meaning match
        importance = importance_factor(c.importance)
        recency = recency_factor(category=c.category, updated_at=c.updated_at, now=now,
                                 half_life_days=half_life_days)
        subject = subject_factor(subject=c.subject, query=query_set)
        ranked.append(Ranked(
            id=c.id, score=relevance.value * importance * recency * subject,
            text=relevance.text, vector=relevance.vector, importance=importance, recency=recency, subject=subject,
        ))
    ranked.sort(key=lambda r: (-r.score, r.id))
    if ranked:
        floor = ranked[0].score * relative_cutoff
        ranked = [r for r in ranked if r.score >= floor]
    return ranked[: max(limit, 0)]
