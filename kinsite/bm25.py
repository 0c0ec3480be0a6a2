"""BM25, the relevance score of history and memory search, as SQL expressions written once for
the PostgreSQL and SQLite queries; they take the query parameters %(k1)s and %(b)s (PARAMS).
PostgreSQL's are float8 throughout: numeric ln() and division cost more than the rest."""

# The usual defaults (Lucene's; SQLite FTS5's bm25(), which history search uses on SQLite).
K1 = 1.2
B = 0.75
PARAMS = {"k1": K1, "b": B}


def _float(vendor: str) -> tuple[str, str]:
    """The cast of a parameter and the literal 1 in the vendor's float arithmetic."""
    return ("::float8", "1.0::float8") if vendor == "postgresql" else ("", "1.0")


def idf_sql(n: str, df: str, *, vendor: str) -> str:
    """ln(1 + (N - df + 0.5) / (df + 0.5)) of a term in `df` of `n` documents. N is clamped
    to df: the two are often two reads, and a write may commit between them."""
    if vendor == "postgresql":
        return f"ln(1.0::float8 + (greatest({n}, {df}) - {df} + 0.5::float8) / ({df} + 0.5::float8))"
    return f"ln(1.0 + (max({n}, {df}) - {df} + 0.5) / ({df} + 0.5))"


def length_norm_sql(length: str, avg_length: str, *, vendor: str) -> str:
    """k1 * (1 - b + b * length / avg_length): the tf saturation of a document of `length`."""
    cast, one = _float(vendor)
    return f"%(k1)s{cast} * ({one} - %(b)s{cast} + %(b)s{cast} * {length} / {avg_length})"


def term_score_sql(idf: str, tf: str, norm: str, *, vendor: str) -> str:
    """One term's score, idf * tf * (k1 + 1) / (tf + norm), `norm` being length_norm_sql's."""
    cast, one = _float(vendor)
    return f"{idf} * {tf} * (%(k1)s{cast} + {one}) / ({tf} + {norm})"


# The same score factored into per-term constants, for queries scoring many postings of few
# terms (PostgreSQL): four operations per posting.


def term_weights_sql(idf: str, avg_length: str) -> tuple[str, str, str]:
    """The per-term constants (weight, norm, norm_per_length) of posting_score_sql."""
    return (f"{idf} * (%(k1)s::float8 + 1.0::float8)",
            "%(k1)s::float8 * (1.0::float8 - %(b)s::float8)",
            f"%(k1)s::float8 * %(b)s::float8 / {avg_length}")


def posting_score_sql(weight: str, norm: str, norm_per_length: str, tf: str, length: str) -> str:
    """One term's score in one posting from its term's constants (term_weights_sql)."""
    return f"{weight} * {tf} / ({tf} + {norm} + {norm_per_length} * {length})"
