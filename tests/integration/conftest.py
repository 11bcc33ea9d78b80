"""History store fixtures: a fresh, empty store per test on SQLite and on a real PostgreSQL.

PostgreSQL comes from `MUSTER_TEST_POSTGRES_URL` (default: the server `hack/install-postgres.sh`
sets up). If it cannot be reached the PostgreSQL tests FAIL with the reason; they never skip.
Each PostgreSQL test gets a schema of its own (via the connection's search_path), dropped after.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url

from controllers.history import migrate
from controllers.history.engine import make_engine

PG_URL = os.environ.get(
    "MUSTER_TEST_POSTGRES_URL", "postgresql+psycopg://muster:muster@127.0.0.1:5432/muster_test"
)


@dataclass
class Store:
    """An isolated history database for one test."""

    dialect: str
    url: URL
    engine: Engine

    def engine_at(self, host: str, port: int, **kwargs: object) -> Engine:
        """Another engine on the same database, reached through `host:port` (PostgreSQL)."""
        return make_engine(self.url.set(host=host, port=port), **kwargs)  # type: ignore[arg-type]

    def count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An engine on the test PostgreSQL database; fails the test if the server is down."""
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:
        pytest.fail(
            f"PostgreSQL at {make_url(PG_URL).render_as_string(hide_password=True)} is "
            f"unreachable ({type(err).__name__}: {err}); run `bash hack/install-postgres.sh` "
            "or set MUSTER_TEST_POSTGRES_URL",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty history database (no tables yet) on each engine."""
    if request.param == "sqlite":
        url = make_url(f"sqlite:///{tmp_path / 'history.db'}")
        engine = make_engine(url, connect_timeout_s=1.0)
        yield Store("sqlite", url, engine)
        engine.dispose()
        return
    admin: Engine = request.getfixturevalue("pg_admin")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    engine = make_engine(url, connect_timeout_s=2.0)
    try:
        yield Store("postgresql", url, engine)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


@pytest.fixture
def migrated(store: Store) -> Store:
    """A history database migrated to head."""
    migrate.upgrade(store.engine)
    return store


class TcpProxy:
    """Forwards a local port to a server; stop() is an outage, start() the recovery.

    Stopping closes the listening socket and every open connection, so clients see what they
    would see if the database host went away: established connections break, new ones are
    refused.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        t = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
            t = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._conns -= {a, b}


@pytest.fixture
def pg_proxy() -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test PostgreSQL server, started."""
    url = make_url(PG_URL)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    yield proxy
    proxy.stop()
