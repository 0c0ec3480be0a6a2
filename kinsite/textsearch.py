"""Full-text query building shared by history and memory search.

User text never reaches the database's query parser as-is: it is split into
plain word terms here, and each backend gets a query made only of those terms
joined with OR. So quotes, operators (AND, NEAR, *, parentheses) and SQL in a
query are just words, and no input can cause a syntax error."""
import re

# Common English function words; both backends would match them everywhere.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during
    each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same
    she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself
    yourselves
    """.split()
)

MAX_TERMS = 64
MAX_TERM_CHARS = 64
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(text: str) -> list[str]:
    """Distinct lowercase word terms of `text`, stop words dropped, in order of
    first appearance, at most MAX_TERMS."""
    terms: list[str] = []
    seen: set[str] = set()
    for match in _WORD.finditer(text.lower()):
        term = match.group()[:MAX_TERM_CHARS]
        if term in STOP_WORDS or term in seen or term == "_" * len(term):
            continue
        seen.add(term)
        terms.append(term)
        if len(terms) == MAX_TERMS:
            break
    return terms


def fts5_match_expression(terms: list[str]) -> str:
    """SQLite FTS5: each term as a quoted string (never an operator), OR-ed."""
    return " OR ".join('"' + term.replace('"', "") + '"' for term in terms)

