"""A simulation run as history records, written to an SQLite store `muster history` reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

from controllers.history import migrate
from controllers.history.engine import make_engine
from controllers.history.records import (
    PreemptionDecision,
    QueueSample,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from controllers.history.rows import write_records
from quota.model.resources import FlavorResource
from quota.simulation.results import SimResult


def _uid(result: SimResult, job: str) -> str:
    # The same scenario and seed give the same uids, so recording a run twice into one store
    # stores it once (the store keys rows on uid, kind and sequence).
    return str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"muster-sim/{result.settings.name}/{result.seed}/{job}")
    )


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def history_records(
    result: SimResult,
) -> Iterator[WorkloadTransition | PreemptionDecision | QueueSample]:
    """The run as history-store records (transitions, preemptions, queue samples)."""
    start = result.settings.start

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    for t in result.transitions:
        namespace, name = _split(t.job)
        yield WorkloadTransition(
            namespace=namespace,
            name=name,
            uid=_uid(result, t.job),
            kind=TransitionKind(t.kind),
            at=at(t.at),
            sequence=t.sequence,
            local_queue=t.local_queue,
            cluster_queue=t.cluster_queue,
            flavors=dict(t.flavors),
            resources=dict(t.resources),
            reason=t.reason[:4000],
            actor=t.actor,
        )
    for p in result.preemptions:
        namespace, name = _split(p.preemptor)
        victims = tuple(
            Victim(
                namespace=_split(job)[0],
                name=_split(job)[1],
                uid=_uid(result, job),
                cluster_queue=queue,
                priority=priority,
                reason=victim.reason,
            )
            for job, queue, priority, victim in p.victims
        )
        reclaim = any(v.kind == "Reclaimed" for *_, v in p.victims)
        yield PreemptionDecision(
            namespace=namespace,
            name=name,
            uid=_uid(result, p.preemptor),
            at=at(p.at),
            victims=victims,
            sequence=p.sequence,
            cluster_queue=p.cluster_queue,
            strategy="reclaim" if reclaim else "preempt",
            reason=f"{len(victims)} victim(s) chosen by the admission cycle",
        )
    resolution = max(1, round(result.settings.sample_interval_s))
    for bucket in result.samples:
        covered = max(1, min(resolution, round(bucket.end - bucket.start)))
        for queue, measures in bucket.values.items():
            if not queue:
                continue  # the cluster total is not a queue
            keys: set[FlavorResource] = set()
            for values in measures.values():
                keys.update(values)
            for flavor, resource in sorted(keys):
                yield QueueSample(
                    cluster_queue=queue,
                    flavor=flavor,
                    resource=resource,
                    at=at(bucket.start),
                    usage=measures.get("usage", {}).get((flavor, resource), 0.0),
                    fair_share=measures.get("fairShare", {}).get((flavor, resource), 0.0),
                    demand=measures.get("demand", {}).get((flavor, resource), 0.0),
                    resolution_s=resolution,
                    covered_s=covered,
                )


def write_history(result: SimResult, path: Path) -> int:
    """Record the run in the SQLite history store at `path` (created and migrated if new).

    The one place the simulator touches the history store: it writes in bulk, in one
    transaction, instead of going through the controller's background recorder.
    """
    engine = make_engine(f"sqlite:///{path.resolve()}")
    try:
        migrate.upgrade(engine)
        records = list(history_records(result))
        with engine.begin() as conn:
            for i in range(0, len(records), 5000):
                write_records(conn, records[i : i + 5000])
        return len(records)
    finally:
        engine.dispose()


# ------------------------------------------------------------------------ table
