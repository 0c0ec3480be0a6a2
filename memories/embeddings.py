"""The embedding service: a memory's or a query's vector from the default provider (a
network call, logged as an LLMCall row by the gateway). Not in services.py: search embeds
its query and services read through search, so it would close an import loop."""
import logging
from dataclasses import dataclass

from kinsite.llm.gateway import llm_embed
from kinsite.llm.providers import get_default_provider
from kinsite.models import Kin, Team
from memories import ranking

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Embedding:
    vector: tuple[float, ...]
    model: str

    def as_bytes(self) -> bytes:
        return ranking.vector_to_bytes(self.vector)


def memory_embed(*, team: Team, kin: Kin | None, text: str, purpose: str) -> Embedding | None:
    """The embedding of `text` from the default provider, or None when it has no
    embedder or the call fails (logged: a memory is never lost to its vector)."""
    provider = get_default_provider()
    if not getattr(provider, "supports_embeddings", False) or not text.strip():
        return None
    try:
        [vector] = llm_embed(purpose=purpose, texts=[text], team=team, kin=kin, provider=provider)
    except Exception:
        logger.warning("Embedding for %s failed; going on without a vector", purpose, exc_info=True)
        return None
    if not vector:
        return None
    return Embedding(vector=tuple(float(x) for x in vector), model=_embedding_model_name(provider))


def embedding_model_current() -> str:
    """The model that makes new vectors, "" when the default provider has no embedder: the
    model search compares with and re-embedding brings every active memory to."""
    provider = get_default_provider()
    if not getattr(provider, "supports_embeddings", False):
        return ""
    return _embedding_model_name(provider)


def _embedding_model_name(provider) -> str:
    # Vectors of different models are not comparable; rows record which model made theirs.
    return (getattr(provider, "embedding_model", "") or f"{provider.name}-embedding")[:200]
