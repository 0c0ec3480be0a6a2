"""The documentation's snippets (README.md, docs/) that carry a token paste and run
unchanged: their placeholder is plain ASCII (YOUR_TOKEN), so a forgotten one answers 401
instead of the client failing to encode a header (an "…" in a header is a UnicodeEncodeError
in curl's shell and in httpx)."""
import re

from tests.support.docs import REPO, documentation_files

# Shell snippets, and the JSON and client code that hold a token or a header.
PASTEABLE = {"sh", "bash", "shell", "json", "jsonc", "python"}
MENTIONS_A_TOKEN = re.compile(r"token|authorization|bearer|ks_", re.IGNORECASE)
CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def token_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, language, line) of every line of a pasteable code block that mentions a token."""
    found = []
    for block in CODE_BLOCK.finditer(text):
        if block[1] not in PASTEABLE:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        for offset, line in enumerate(block[2].splitlines()):
            if MENTIONS_A_TOKEN.search(line):
                found.append((first + offset, block[1], line))
    return found


def test_token_lines_of_code_blocks_are_ascii():
    lines = [(path.relative_to(REPO), number, line)
             for path in documentation_files()
             for number, _, line in token_lines(path.read_text(encoding="utf-8"))]
    assert any("YOUR_TOKEN" in line for _, _, line in lines)
    assert [(path, number, line) for path, number, line in lines if not line.isascii()] == []


def test_the_check_finds_a_unicode_placeholder():
    old = '```sh\ncurl -H "Authorization: Bearer ks_\u2026" $API/kins/\n```\n\n```text\nks_\u2026\n```\n'
    assert [line for _, _, line in token_lines(old) if not line.isascii()] == [
        'curl -H "Authorization: Bearer ks_\u2026" $API/kins/']
