"""The embedding service: the vectors of memories and queries, from the source EMBEDDINGS
names: the in-process model (local, kinsite.llm.local_embedder), the endpoint's
LLM_EMBEDDING_MODEL (endpoint: a network call, logged as an LLMCall row by the gateway), or
none (off). Not in services.py: search embeds its query and services read through search,
so it would close an import loop."""
import logging
from dataclasses import dataclass

from django.conf import settings

from kinsite.llm import local_embedder
from kinsite.llm.gateway import embedding_model_current, llm_embed
from kinsite.llm.providers import get_default_provider
from kinsite.models import Kin, Team
from memories import ranking

logger = logging.getLogger(__name__)

LOCAL = "local"  # the EMBEDDINGS value of the in-process model


@dataclass(frozen=True)
class Embedding:
    vector: tuple[float, ...]
    model: str

    def as_bytes(self) -> bytes:
        return ranking.vector_to_bytes(self.vector)


def memory_embed(*, team: Team, kin: Kin | None, text: str, purpose: str) -> Embedding | None:
    """The embedding of `text`, or None when there is no embedder or it fails (logged: a
    memory is never lost to its vector)."""
    model = embedding_model_current()
    if not model or not text.strip():
        return None
    try:
        [vector] = embed_texts([text], team=team, kin=kin, purpose=purpose)
    except Exception:
        logger.warning("Embedding for %s failed; going on without a vector", purpose, exc_info=True)
        return None
    if not vector:
        return None
    return Embedding(vector=tuple(vector), model=model)


def embed_texts(texts: list[str], *, team: Team, kin: Kin | None = None, purpose: str) -> list[list[float]]:
    """The vectors of `texts`, in order, from the current source (there must be one:
    embedding_model_current() is not ""). Raises what the embedder raises."""
    if settings.EMBEDDINGS == LOCAL:
        return local_embedder.local_embedder().embed(texts).tolist()
    return [[float(x) for x in vector] for vector in
            llm_embed(purpose=purpose, texts=texts, team=team, kin=kin, provider=get_default_provider())]
