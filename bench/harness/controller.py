"""The controller under test: the Manager `muster controller` runs, in this process (so that
a benchmark can count its requests and time its loops), or `muster controller` itself as a
process of its own (so that /proc and the audit log tell its CPU and writes apart)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controllers.localcluster.cluster import free_port
from controllers.manager.manager import Manager
from controllers.manager.options import Options

MUSTER = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "muster")


def start_manager(
    client: Any,
    *,
    prepare: Callable[[Manager], None] | None = None,
    settle: float = 1.5,
    **options: Any,
) -> Manager:
    """A leading Manager on `client` with its webhooks served, `prepare`d before it starts;
    `options` beyond a free webhook port, leader election and a Lease of its own."""
    manager = Manager(
        client,
        Options(
            webhook_port=free_port(),
            leader_elect=True,
            lease_name=f"bench-{uuid.uuid4().hex[:6]}",
            **options,
        ),
    )
    if prepare is not None:
        prepare(manager)
    manager.start()
    if manager.elector is not None:
        manager.elector.wait_leader(threading.Event())
    if manager.webhooks.server is not None:
        manager.webhooks.server.wait_ready(120)
    time.sleep(settle)  # webhooks registered, caches warm
    return manager


def stop_manager(manager: Manager) -> None:
    manager.stop_event.set()
    manager.shutdown()


def controller_argv(
    kubeconfig: str | Path,
    *,
    lease: str,
    database_url: str,
    spool_dir: Path,
    webhook_port: int | None = None,
    metrics_port: int = 0,
    lease_seconds: tuple[int, int, int] | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """`muster controller` against `kubeconfig`, recording history to `database_url`;
    `lease_seconds` (lease duration, renew deadline, retry period) instead of the defaults
    when a standby must take over quickly."""
    failover: list[str] = []
    if lease_seconds is not None:
        for flag, seconds in zip(
            ("--lease-duration", "--renew-deadline", "--retry-period"), lease_seconds, strict=True
        ):
            failover += [flag, str(seconds)]
    return [
        MUSTER,
        "controller",
        "--kubeconfig",
        str(kubeconfig),
        "--webhook-port",
        str(webhook_port or free_port()),
        "--lease-name",
        lease,
        "--metrics-port",
        str(metrics_port),
        "--database-url",
        database_url,
        "--history-spool-dir",
        str(spool_dir),
        *failover,
        *flags,
    ]
