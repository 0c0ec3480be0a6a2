"""Fake embedders for memory tests: deterministic, offline."""
import functools
import hashlib
import math
import random
import re

from kinsite.llm.types import LLMError
from tests.support.scripted_model import ScriptedProvider, hashed_bag_of_words

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


class DenseSynonymEmbedder(ScriptedProvider):
    """Like SynonymEmbedder, but dense: each (synonym-folded) word is a fixed random unit
    vector of 256 dimensions and a text the normalised sum of its words'. Texts without a
    common word are nearly orthogonal and spread over the sphere, as a real embedder's are;
    the hashed bag of words instead puts texts that share most words in one tight cluster,
    a shape HNSW graphs serve badly (an outlier among them can become unreachable)."""

    dimensions = 256

    def embed_result(self, texts, *, model=None):
        result = super().embed_result(texts, model=model)
        result.vectors = [self.vector(text) for text in texts]
        return result

    @classmethod
    def vector(cls, text: str) -> list[float]:
        total = [0.0] * cls.dimensions
        for word in re.findall(r"\w+", text.lower()):
            for i, x in enumerate(_dense_word(SYNONYMS.get(word, word), cls.dimensions)):
                total[i] += x
        norm = math.sqrt(sum(x * x for x in total))
        return [x / norm for x in total] if norm else total


@functools.cache
def _dense_word(word: str, dimensions: int) -> tuple[float, ...]:
    rng = random.Random(int.from_bytes(hashlib.md5(word.encode()).digest()[:8], "big"))
    return tuple(rng.gauss(0.0, 1.0) for _ in range(dimensions))
