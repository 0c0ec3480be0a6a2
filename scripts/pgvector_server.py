"""A private PostgreSQL 16 with pgvector for the pgvector tests and benchmarks, from the PyPI
package pgserver (a dev dependency): Debian's PostgreSQL has no pgvector package.

    .venv/bin/python scripts/pgvector_server.py start DIR   # prints the Django DATABASE_URL
    .venv/bin/python scripts/pgvector_server.py url DIR     # the same, for a running server
    .venv/bin/python scripts/pgvector_server.py stop DIR

DIR is a directory under /tmp (the data lives in DIR/pgdata): run as root, pgserver runs the
server as a system user `pgserver` it creates, and makes every parent of the data directory
readable by others (o+rx), which is harmless under /tmp. The server listens on a Unix socket
only (no TCP port to collide with the machine's PostgreSQL); the URL names the socket's
directory as its host, percent-encoded, as dj-database-url reads it. The server keeps
running after `start` returns, until `stop`."""
import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

DATABASE = "kinsite"


def _server(directory: Path):
    import pgserver

    directory.mkdir(parents=True, exist_ok=True)
    # cleanup_mode None: this process exits right away, the server stays up for the tests.
    return pgserver.get_server(directory / "pgdata", cleanup_mode=None)


def django_url(socket_dir: Path, database: str = DATABASE) -> str:
    return f"postgres://postgres@{quote(str(socket_dir), safe='')}/{database}"


def start(directory: Path) -> str:
    server = _server(directory)
    # The application's database (pytest-django makes test_kinsite beside it), with the
    # extension ready, as an administrator would have it.
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE};")
    return django_url(server.get_postmaster_info().socket_dir)


def stop(directory: Path) -> None:
    pgdata = (directory / "pgdata").resolve()
    if not (pgdata / "postmaster.pid").exists():
        return
    import pgserver

    # As root pgserver runs the server as its `pgserver` user; pg_ctl must be that user too.
    user = "pgserver" if os.geteuid() == 0 else None
    with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "url"])
    parser.add_argument("directory", type=Path, help="a directory under /tmp; the data goes in DIR/pgdata")
    args = parser.parse_args(argv)
    directory = args.directory.resolve()
    if args.action == "stop":
        stop(directory)
        return 0
    print(start(directory))  # start and url alike: starting a running server only reads its socket
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
