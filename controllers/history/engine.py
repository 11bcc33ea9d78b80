"""Where the history store lives: one URL setting for PostgreSQL (production) or SQLite (embedded).

The URL comes from the `--database-url` flag, else `MUSTER_DATABASE_URL`, else an SQLite file
under the user's data directory. A bare file path means an SQLite file. `postgresql://` and
`postgres://` URLs use psycopg 3, the only PostgreSQL driver Muster ships with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

ENV_VAR = "MUSTER_DATABASE_URL"


class DatabaseURLError(ValueError):
    """The history database URL is unusable; the message names the setting and the rule."""


def default_sqlite_path() -> Path:
    """The embedded store: `$XDG_DATA_HOME/muster/history.db` (~/.local/share by default)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "muster" / "history.db"


def database_url(explicit: str | None = None, *, source: str = "--database-url") -> URL:
    """Resolve the history database URL: the flag, else $MUSTER_DATABASE_URL, else SQLite."""
    if explicit:
        raw, origin = explicit, source
    elif os.environ.get(ENV_VAR):
        raw, origin = os.environ[ENV_VAR], ENV_VAR
    else:
        raw, origin = f"sqlite:///{default_sqlite_path()}", "the default"
    return parse_database_url(raw, origin=origin)


def parse_database_url(raw: str, *, origin: str = "--database-url") -> URL:
    """Parse and normalise one URL or SQLite file path; `origin` names the setting in errors."""
    raw = raw.strip()
    if "://" not in raw:
        # A plain path: the embedded store in that file.
        return make_url(f"sqlite:///{Path(raw).expanduser().absolute()}")
    try:
        url = make_url(raw)
    except ArgumentError as err:
        raise DatabaseURLError(f"{origin}: {raw!r} is not a database URL ({err})") from None
    backend, _, driver = url.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise DatabaseURLError(
                f"{origin}: driver {driver!r} is not supported for PostgreSQL; "
                "use postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
            )
        if not url.database:
            raise DatabaseURLError(f"{origin}: a PostgreSQL URL must name a database")
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise DatabaseURLError(f"{origin}: driver {driver!r} is not supported for SQLite")
        if not url.database or url.database == ":memory:":
            raise DatabaseURLError(
                f"{origin}: an SQLite history store must be a file (sqlite:///PATH), "
                "because the recorder writes from its own thread and connection"
            )
        return url.set(drivername="sqlite")
    raise DatabaseURLError(
        f"{origin}: scheme {url.drivername!r} is not supported; "
        "use postgresql+psycopg://... or sqlite:///PATH"
    )


def display_url(url: URL) -> str:
    """The URL as safe to print: the password masked."""
    return url.render_as_string(hide_password=True)


def make_engine(url: URL | str, *, connect_timeout_s: float = 5.0, **kwargs: Any) -> Engine:
    """Create an engine for the history store.

    `connect_timeout_s` bounds how long a write waits for an unreachable PostgreSQL server or a
    locked SQLite file, so the recorder notices an outage quickly and spools instead.
    """
    if isinstance(url, str):
        url = parse_database_url(url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"timeout": connect_timeout_s}, pool_pre_ping=True, **kwargs
        )
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    return create_engine(
        url,
        connect_args={"connect_timeout": max(1, round(connect_timeout_s))},
        pool_pre_ping=True,
        pool_size=2,
        max_overflow=2,
        **kwargs,
    )


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the CLI read while the controller's recorder writes; NORMAL sync is durable
    # against process crashes, which is what an embedded store needs. WAL is a property of
    # the file, written into it: set when Muster creates the store (an empty file), never on
    # a file that holds something else, which Muster refuses unchanged. Reading the schema
    # also makes a file that is not a database fail here, on first use.
    cur = dbapi_conn.cursor()
    if cur.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
