"""How stored, untrusted text is placed in a prompt so it can never pose as its structure:
`one_line` for fields, `quoted` for material of several lines, `guarded` for text code
composes around fields. All escape a tag-opening "<" and judge look-alikes as what they look
like (NFKC, past invisible characters), but write the text itself unfolded, since folding
would change benign text (x², ①, the joiners emoji and Indic spelling need). Pure functions;
the rule is in docs/concepts/sessions.md#stored-text-is-data-never-structure."""
import re
import unicodedata

# Every character NFKC folds to "<" (a test checks there are no others). One opens a tag when
# the next visible character folds to a letter or one of "/!?|", or is a slash NFKC leaves
# alone; any other "<" stays ("a < 3", "x <= y", "<--", "<@123>").
LESS_THAN_SIGNS = "<\ufe64\uff1c"
_LESS_THAN = re.compile(f"[{LESS_THAN_SIGNS}]")
_TAG_MARKS = "/!?|"
_SLASH_LIKE = "\u2044\u2215\u29f8"
# Categories a reader does not see as a character of their own: controls, format (zero-width,
# joiners, BOM, soft hyphen, bidi), unassigned, private use, surrogates, combining marks.
_INVISIBLE = frozenset({"Cc", "Cf", "Cn", "Co", "Cs", "Mn", "Me"})
# Whitespace (every Unicode space and line break, U+2028 and U+2029 included) and C0/C1 controls.
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
# Control characters other than the tab, once the text is cut into lines.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A line that opens with a role or instruction label, after any indentation and Markdown
# marks: "SYSTEM:", "- **Assistant**:", "[user]:", "## Developer:".
_ROLE_LABEL = re.compile(
    r"^[\s>#*_+\-\[(|`]*(system|assistant|user|developer|tool|function|human|ai|model|instructions?)"
    r"[\s*_\])|`]*:",
    re.IGNORECASE,
)
# A Markdown heading (ATX), after up to three spaces of indentation.
_HEADING = re.compile(r"^ {0,3}#")
QUOTE = "> "
ELLIPSIS = "…"


def _opens_tag(text: str, start: int) -> bool:
    # Each "<" looks only as far as the next visible character, so the scan is linear.
    for index in range(start, len(text)):
        ch = text[index]
        if ch.isspace() or unicodedata.category(ch) in _INVISIBLE:
            continue
        seen = unicodedata.normalize("NFKC", ch)[0]
        return seen.isalpha() or seen in _TAG_MARKS or ch in _SLASH_LIKE
    return False


def escape_tags(text: str) -> str:
    """`text` with every tag-opening "<" (or look-alike) written as "&lt;"."""
    if not _LESS_THAN.search(text):
        return text
    return _LESS_THAN.sub(lambda match: "&lt;" if _opens_tag(text, match.end()) else match.group(), text)


def folded(text: str) -> str:
    """`text` as a reader sees it: invisible characters (not whitespace) dropped, NFKC-folded.
    For checks only; what goes in a prompt is the text itself."""
    if text.isascii():
        return text
    visible = "".join(ch for ch in text if ch.isspace() or unicodedata.category(ch) not in _INVISIBLE)
    return unicodedata.normalize("NFKC", visible)


def one_line(text: str, max_chars: int | None = None) -> str:
    """`text` as one line: whitespace and control characters collapsed to single spaces,
    trimmed, tags escaped, cut to `max_chars` (ending in "…") when given."""
    # The common case (a plain name) costs three C-level checks: prompts render hundreds.
    if not text.isprintable() or _LESS_THAN.search(text):
        text = escape_tags(_SPACE_OR_CONTROL.sub(" ", text))
    text = text.strip()
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1].rstrip() + ELLIPSIS
    return text


def _lines(text: str) -> list[str]:
    # splitlines() breaks at every line separator (\r, \v, \f, \x1c-\x1e, \x85, U+2028,
    # U+2029), so none survives inside a line to start a new one where a reader looks.
    return [_CONTROL.sub("", line).rstrip() for line in escape_tags(text.strip()).splitlines()]


def quoted(text: str, *, indent: str = "") -> str:
    """`text` with every line prefixed by `indent` and the quote marker ("> "; a blank line
    by ">" alone), tags escaped. "" stays ""."""
    if not text.strip():
        return ""
    return "\n".join(f"{indent}{QUOTE}{line}" if line else f"{indent}{QUOTE.rstrip()}" for line in _lines(text))


def guarded(text: str, *, keep_headings: bool = False) -> str:
    """`text` with tags escaped and any line beginning with a role label, or with a heading
    marker unless `keep_headings`, quoted. For text code composes around one-line fields (the
    canvas), and a document the model rewrites keeping its headings (`keep_headings`)."""
    def is_marked(line: str) -> bool:
        line = folded(line)
        return bool(_ROLE_LABEL.match(line) or (not keep_headings and _HEADING.match(line)))

    return "\n".join(QUOTE + line if is_marked(line) else line for line in _lines(text))


def continued(first: str, rest: str, *, indent: str = "  ") -> str:
    """A line made of a fixed prefix (`first`) and untrusted text of one or more lines:
    its first line stays on the prefix's line, the others follow quoted and indented."""
    lines = _lines(rest)
    line = first + (one_line(lines[0]) if lines else "")
    if len(lines) < 2:
        return line
    return line + "\n" + quoted("\n".join(lines[1:]), indent=indent)


def unsafe_characters(text: str) -> list[str]:
    """The characters that keep `text` from being one line (controls, tabs, line breaks, the
    Unicode line and paragraph separators), each once, as escapes ("\\n"), for an error message."""
    found = dict.fromkeys(ch for ch in text if unicodedata.category(ch) in ("Cc", "Zl", "Zp"))
    return [ch.encode("unicode_escape").decode("ascii") for ch in found]


def one_line_problem(text: str) -> str | None:
    """Why `text` cannot be a one-line name (a sender), or None: the message a form or
    serializer answers with. Edges refuse such names rather than change them silently."""
    found = unsafe_characters(text)
    if not found:
        return None
    return ("Must be one line: no line breaks, tabs or other control characters "
            f"(found {', '.join(found)}).")
