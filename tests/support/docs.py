"""The project's documentation as tests read it: README.md and every page under docs/."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def documentation_files() -> list[Path]:
    """README.md, then docs/**/*.md in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def documentation_text() -> str:
    """All of the documentation, one file after another: for checks that a text is documented somewhere."""
    return "\n\n".join(path.read_text(encoding="utf-8") for path in documentation_files())


def docs_page(name: str) -> str:
    """One page of docs/, e.g. docs_page("deployment.md")."""
    return (DOCS / name).read_text(encoding="utf-8")
