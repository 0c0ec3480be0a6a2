"""Fake embedders for memory tests: deterministic, offline."""
import re

from kinsite.llm.providers import ScriptedProvider, hashed_bag_of_words
from kinsite.llm.types import LLMError

# Words a real embedder would place together; the fake maps each to one concept word.
SYNONYMS = {
    "likes": "prefers", "like": "prefers", "liked": "prefers", "prefer": "prefers",
    "automobile": "car", "vehicle": "car",
    "brief": "short", "concise": "short",
    "replies": "answers", "reply": "answers", "answer": "answers",
}


# Wide enough that sentences sharing no word rarely share a slot: at the scripted provider's
# 64, "where is my car" and "The newsletter goes out on the first Thursday" collide at a
# cosine of 0.32, which no real embedder gives them (all-MiniLM-L6-v2: 0.05).
SYNONYM_DIMENSIONS = 512


class SynonymEmbedder(ScriptedProvider):
    """The scripted provider's hashed bag of words, after folding synonyms together."""

    def embed_result(self, texts, *, model=None):
        result = super().embed_result(texts, model=model)
        result.vectors = [
            hashed_bag_of_words(" ".join(SYNONYMS.get(w, w) for w in re.findall(r"\w+", t.lower())),
                                dimensions=SYNONYM_DIMENSIONS)
            for t in texts
        ]
        return result


class NumberBlindEmbedder(ScriptedProvider):
    """The scripted provider's hashed bag of words with digits masked: like a real
    embedder, it places "at 3pm" and "at 5pm" together."""

    def embed_result(self, texts, *, model=None):
        result = super().embed_result(texts, model=model)
        result.vectors = [hashed_bag_of_words(re.sub(r"\d", "#", t)) for t in texts]
        return result


class BrokenEmbedder(ScriptedProvider):
    def embed_result(self, texts, *, model=None):
        raise LLMError("embedding endpoint down")
