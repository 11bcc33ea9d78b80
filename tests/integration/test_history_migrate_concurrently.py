"""Two replicas migrating one PostgreSQL history store at the same moment, as the chart's two
pods do when they start together: each is a process of its own with its own engine, both call
`migrate.upgrade` on a fresh database at once, and both end at head, neither failing."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url

from controllers.history import migrate
from controllers.history.engine import make_engine
from controllers.history.models import Base
from tests.integration.conftest import PG_URL

pytestmark = pytest.mark.postgres

REPLICAS = 2
ROUNDS = 4  # fresh stores; each round both replicas start together


def replica(urls: list[str], barrier: Barrier, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One replica: for each store, wait for the other, then migrate; report what happened."""
    for url in urls:
        engine = make_engine(url, connect_timeout_s=5.0)
        barrier.wait(timeout=60)
        try:
            migrate.upgrade(engine)
            results.put((url, migrate.current_revision(engine)))
        except Exception as error:  # reported, not raised: the test names it
            results.put((url, f"{type(error).__name__}: {error}".splitlines()[0]))
        finally:
            engine.dispose()


@pytest.fixture
def schemas(pg_admin: Engine) -> Iterator[list[str]]:
    """ROUNDS empty schemas of the test database, dropped afterwards."""
    names = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(ROUNDS)]
    with pg_admin.connect() as conn:
        for name in names:
            conn.execute(text(f"CREATE SCHEMA {name}"))
    yield names
    with pg_admin.connect() as conn:
        for name in names:
            conn.execute(text(f"DROP SCHEMA {name} CASCADE"))


def test_two_replicas_migrating_at_once_both_reach_head(schemas: list[str]) -> None:
    base = make_url(PG_URL)
    urls = [
        base.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
        for name in schemas
    ]
    # Processes, not threads: each replica is one, and Alembic's `op`/`context` are
    # per-process globals.
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(REPLICAS)
    results = spawn.Queue()
    workers = [
        spawn.Process(target=replica, args=(urls, barrier, results)) for _ in range(REPLICAS)
    ]
    for worker in workers:
        worker.start()
    got = [results.get(timeout=120) for _ in range(REPLICAS * ROUNDS)]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    head = migrate.head_revision()
    failed = [(make_url(url).query["options"], outcome) for url, outcome in got if outcome != head]
    assert not failed, failed
    for url in urls:
        engine = make_engine(url)
        try:
            assert migrate.current_revision(engine) == head
            assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
            with engine.connect() as conn:
                stamps = conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one()
            assert stamps == 1
        finally:
            engine.dispose()
