"""The vector side of memory search: cosine similarity of a query's embedding to the
stored vectors of a scope, scanned in Python (there is no pgvector)."""
from django.db.models import QuerySet

from memories import ranking
from memories.embeddings import Embedding

# Without pgvector the vector side is a scan in Python, so it is bounded: the most
# recently updated memories of the scope that carry a vector of the query's model.
VECTOR_SCAN_LIMIT = 2_000


def similarities(scope: QuerySet, embedding: Embedding) -> dict[int, float]:
    """Cosine similarity by memory id, for the memories of `scope` (a Memory queryset)
    whose vector the same model made."""
    rows = (
        scope.filter(embedding__isnull=False, embedding_model=embedding.model)
        .order_by("-updated_at", "-id")
        .values_list("id", "embedding")[:VECTOR_SCAN_LIMIT]
    )
    by_id = {}
    for memory_id, data in rows:
        vector = ranking.vector_from_bytes(data)
        if vector is not None and len(vector) == len(embedding.vector):
            by_id[memory_id] = ranking.cosine(embedding.vector, vector)
    return by_id
