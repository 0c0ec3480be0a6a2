"""docs/configuration.md names every environment variable Kinsite reads, each in one table
row: a setting added to kinsite/settings.py (or read anywhere else in the code, the Procfile
or the scripts) without a row there fails here, and so does a row for a variable nothing
reads any more."""
import re
import tomllib

from tests.support.docs import REPO, docs_page

# kinsite/settings.py reads the environment through kinsite/env.py's typed readers.
SETTINGS_READ = re.compile(r"\benv_(?:str|bool|int|float|list|choice)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']")
# Elsewhere in Python: os.environ.get("X"), os.environ.setdefault("X", ...), os.getenv("X"), os.environ["X"].
PYTHON_READ = re.compile(
    r"\b(?:environ\.get|environ\.setdefault|getenv)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
    r"|\benviron\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\]"
)
# Shell and Procfile: ${X:-default} or ${X}.
SHELL_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::-|\})")
# A variable row of the configuration page: | `NAME` | default | meaning |
DOCUMENTED_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)
# Set for Django by the entry points (manage.py, asgi, wsgi, celery), never by an operator;
# and the system's own PATH, which scripts/check-fresh-install passes on.
NOT_CONFIGURATION = {"DJANGO_SETTINGS_MODULE", "PATH"}
SCRIPTS = ["Procfile", "scripts/serve", "scripts/bootstrap", "scripts/test", "scripts/check-fresh-install"]


def production_modules():
    """The Python files of the apps pyproject.toml's import contracts name, and manage.py."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path
    yield REPO / "manage.py"


def names_read(text: str, *, settings_module: bool = False, shell: bool = False) -> set[str]:
    found = {a or b for a, b in PYTHON_READ.findall(text)}
    if settings_module:
        found |= set(SETTINGS_READ.findall(text))
    if shell:
        found |= set(SHELL_READ.findall(text))
    return found - NOT_CONFIGURATION


def variables_read() -> set[str]:
    found = set()
    for path in production_modules():
        found |= names_read(path.read_text(encoding="utf-8"), settings_module=path.name == "settings.py")
    for name in SCRIPTS:
        found |= names_read((REPO / name).read_text(encoding="utf-8"), shell=True)
    return found


def variables_read_by_tests() -> set[str]:
    return set().union(*(names_read(path.read_text(encoding="utf-8")) for path in (REPO / "tests").rglob("*.py")))


def documented_rows() -> list[str]:
    return DOCUMENTED_ROW.findall(docs_page("configuration.md"))


def test_the_collector_sees_settings_and_other_modules():
    read = variables_read()
    # From kinsite/settings.py, kinsite/asgi.py, the Procfile and scripts/test respectively.
    assert {"SECRET_KEY", "MEMORY_VECTOR_CACHE_MB", "DB_CONN_MAX_AGE", "WEB_CONCURRENCY", "TEST_REDIS_URL"} <= read
    assert len(read) > 60


def test_the_collector_reads_each_form():
    text = 'A = env_int("ONE", 1)\nB = os.environ.get("TWO")\nC = os.getenv("THREE")\nD = os.environ["FOUR"]\n'
    assert names_read(text, settings_module=True) == {"ONE", "TWO", "THREE", "FOUR"}
    assert names_read("--port ${PORT:-8000} ${HOST} $$", shell=True) == {"PORT", "HOST"}


def test_every_variable_read_is_documented():
    assert sorted(variables_read() - set(documented_rows())) == []


def test_each_variable_is_documented_once():
    rows = documented_rows()
    assert sorted({name for name in rows if rows.count(name) > 1}) == []


def test_every_documented_variable_is_read():
    assert sorted(set(documented_rows()) - variables_read() - variables_read_by_tests()) == []
