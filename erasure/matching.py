"""Which text is about a person: pure functions over plain text, no database.

A person is named by the sender name their messages carry and/or the name their text is
found by (the subject). Text mentions them when one of the names occurs in it as whole
words, in any case, after Unicode compatibility folding (NFKC) and with invisible characters
removed, so "ZELDA", "Zelda's" and "Ｚｅｌｄａ" all count and "Zeldas" does not.
"""
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property

# What stands in for a redacted line or value in the text that is kept.
ERASED = "[erased]"

# Format characters (zero-width spaces and joiners, bidi controls, the BOM, soft hyphens):
# invisible in text, so they may sit inside a name without showing.
_INVISIBLE = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"}
_INVISIBLE_TABLE = str.maketrans(dict.fromkeys(_INVISIBLE))


def fold(text: str) -> str:
    """The text as matching sees it: NFKC, no invisible characters, case-folded."""
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE_TABLE).casefold()


@dataclass(frozen=True)
class Person:
    sender: str = ""
    subject: str = ""

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name in (self.sender.strip(), self.subject.strip()) if name))

    @cached_property
    def _pattern(self) -> re.Pattern:
        words = [r"\s+".join(re.escape(part) for part in fold(name).split()) for name in self.names]
        return re.compile(r"(?<!\w)(?:" + "|".join(words) + r")(?!\w)")

    def is_sender(self, sender: str) -> bool:
        return bool(self.sender.strip()) and fold(sender).strip() == fold(self.sender).strip()

    def mentioned_in(self, text: str) -> bool:
        return bool(text) and self._pattern.search(fold(text)) is not None

    def mentioned_in_value(self, value) -> bool:
        """Whether any text inside a JSON value (keys too) mentions the person."""
        return self.mentioned_in(json.dumps(value, ensure_ascii=False))

    def lines_without(self, text: str) -> str:
        """The text without the lines that mention the person (a new experience version)."""
        return "\n".join(line for line in text.split("\n") if not self.mentioned_in(line))

    def lines_redacted(self, text: str) -> str:
        """The text with each line that mentions the person replaced by ERASED."""
        return "\n".join(ERASED if self.mentioned_in(line) else line for line in text.split("\n"))

    def value_redacted(self, value):
        """A JSON value with every string that mentions the person redacted line by line, and
        every object key that does replaced by ERASED."""
        if isinstance(value, str):
            return self.lines_redacted(value)
        if isinstance(value, list):
            return [self.value_redacted(item) for item in value]
        if isinstance(value, dict):
            return {(ERASED if self.mentioned_in(key) else key): self.value_redacted(item)
                    for key, item in value.items()}
        return value


def excerpt(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
