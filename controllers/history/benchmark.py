"""Benchmark of the history store: what recording costs the caller, and what the store sustains.

Figures (printed; nothing here fails on time):
- `record()` cost per call to the caller, with the writer thread busy in the background;
- sustained transitions per second through the recorder into PostgreSQL and into SQLite
  (from the first `record()` to the moment the last one is committed);
- overhead on an admission cycle: cycles over the same snapshot with and without recording
  their decisions while the writer thread writes the previous cycles' records (on a 2-core
  machine the writer competes for the interpreter, which is the real cost).
"""

from __future__ import annotations

import gc
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from controllers.history import migrate
from controllers.history.engine import display_url, make_engine
from controllers.history.recorder import HistoryRecorder
from controllers.history.records import (
    PreemptionDecision,
    Record,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from quota.admission.cycle import admission_cycle
from quota.model.decisions import CycleResult
from quota.model.snapshot import FlavorQuota, PodSet, QueueSpec, Snapshot, Workload

GPU = "nvidia.com/gpu"
T0 = datetime(2026, 3, 2, tzinfo=UTC)


@dataclass
class CycleFigures:
    """Admission-cycle time without and with the store, for one way of recording."""

    mode: str
    gap_ms: float
    # Fastest of the runs: on a shared machine the minimum is the figure noise spares.
    cycle_ms: float
    with_store_ms: float
    # What recording costs the loop's own thread per cycle, measured on its own.
    caller_ms: float

    @property
    def overhead_pct(self) -> float:
        return 100.0 * (self.with_store_ms - self.cycle_ms) / self.cycle_ms

    @property
    def caller_pct(self) -> float:
        return 100.0 * self.caller_ms / self.cycle_ms


@dataclass
class Figures:
    """What one benchmark run measured, per engine."""

    engine: str
    record_ns: float
    writer_cpu_us: float
    transitions_per_s: float
    records_per_cycle: int
    cycles: list[CycleFigures]


def transitions(count: int, run: str) -> list[Record]:
    """`count` distinct admission-shaped transitions."""
    kinds = (TransitionKind.QUOTA_RESERVED, TransitionKind.ADMITTED)
    return [
        WorkloadTransition(
            namespace=f"team-{i % 50}",
            name=f"job-{i // 2}",
            uid=f"{run}-{i // 2}",
            kind=kinds[i % 2],
            at=T0 + timedelta(milliseconds=i),
            local_queue="default",
            cluster_queue=f"cq-{i % 50}",
            flavors={GPU: "h100", "cpu": "default"},
            resources={GPU: 8, "cpu": 64_000, "memory": 512 << 30},
            reason="admitted: fits in quota of cq (nvidia.com/gpu 8 of 64 used)",
        )
        for i in range(count)
    ]


def cycle_snapshot(leaves: int = 50, per_leaf: int = 40) -> Snapshot:
    """A two-level tree with `leaves` teams; capacity for about half of the pending work."""
    queues: dict[str, QueueSpec] = {}
    for d in range(5):
        queues[f"dept-{d}"] = QueueSpec(
            name=f"dept-{d}", flavors=(FlavorQuota("h100", {GPU: 8 * leaves // 5}),)
        )
    for t in range(leaves):
        queues[f"cq-{t}"] = QueueSpec(
            name=f"cq-{t}",
            parent=f"dept-{t % 5}",
            over_quota_weight=1.0 + t % 3,
            flavors=(FlavorQuota("h100", {GPU: 8}),),
        )
    pending = tuple(
        Workload(
            key=f"team-{t}/job-{j}",
            queue=f"cq-{t}",
            priority=j % 3,
            arrival=float(j),
            pod_sets=(PodSet("main", 1 + j % 4, {GPU: 1}),),
        )
        for t in range(leaves)
        for j in range(per_leaf)
    )
    capacity = {("h100", GPU): 8 * leaves * 2}
    return Snapshot(now=1_000.0, queues=queues, flavors={}, capacity=capacity, pending=pending)


def cycle_records(result: CycleResult, cycle: int, at: datetime) -> list[Record]:
    """What the controller records for one cycle's decisions."""
    out: list[Record] = []
    for admit in result.admit:
        namespace, _, name = admit.workload.partition("/")
        for kind in (TransitionKind.QUOTA_RESERVED, TransitionKind.ADMITTED):
            out.append(
                WorkloadTransition(
                    namespace=namespace,
                    name=name,
                    uid=f"{admit.workload}@{cycle}",
                    kind=kind,
                    at=at,
                    sequence=cycle,
                    cluster_queue=admit.queue,
                    flavors=dict(admit.assignments[0].flavors) if admit.assignments else {},
                    reason=admit.reason,
                )
            )
    for p in result.preempt:
        namespace, _, name = p.preemptor.partition("/")
        out.append(
            PreemptionDecision(
                namespace=namespace,
                name=name,
                uid=f"{p.preemptor}@{cycle}",
                at=at,
                sequence=cycle,
                victims=tuple(
                    Victim(*v.workload.partition("/")[::2], uid=v.workload, cluster_queue=v.queue)
                    for v in p.victims
                ),
            )
        )
    return out


def _interleaved_ms(
    base: Callable[[], object], other: Callable[[], object], repeat: int, gap_s: float
) -> tuple[float, float]:
    """Fastest times of `base` and `other`, run alternately so machine noise hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        for fn, times in ((base, a), (other, b)):
            time.sleep(gap_s)
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
    return min(a), min(b)


def _fastest_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


def measure(
    engine: Engine, name: str, records: int, cycles: int, gaps_s: list[float], spool: Path
) -> Figures:
    """Run the measurements against one migrated, empty store."""
    gauge = Gauge("muster_history_backlog_records", "bench", registry=CollectorRegistry())
    batch = transitions(records, uuid.uuid4().hex[:8])
    snapshot = cycle_snapshot()
    result = admission_cycle(snapshot)
    records_per_cycle = len(cycle_records(result, 0, T0))
    counter = iter(range(1, 10**9))

    def eager(recorder: HistoryRecorder) -> None:
        # Build every record on the loop's thread, then hand each over.
        with recorder.busy():
            result = admission_cycle(snapshot)
            for rec in cycle_records(result, next(counter), datetime.now(UTC)):
                recorder.record(rec)

    def deferred(recorder: HistoryRecorder) -> None:
        # Hand over the frozen cycle result; the records are built and written ahead here.
        with recorder.busy():
            result = admission_cycle(snapshot)
            seq, at = next(counter), datetime.now(UTC)
            recorder.record_later(lambda: cycle_records(result, seq, at))

    def eager_caller(recorder: HistoryRecorder) -> None:
        with recorder.busy():
            for rec in cycle_records(result, next(counter), datetime.now(UTC)):
                recorder.record(rec)

    def deferred_caller(recorder: HistoryRecorder) -> None:
        with recorder.busy():
            seq, at = next(counter), datetime.now(UTC)
            recorder.record_later(lambda: cycle_records(result, seq, at))

    with HistoryRecorder(engine, spool / name, backlog_gauge=gauge) as recorder:
        gc.collect()
        start = time.perf_counter()
        with recorder.busy():  # hand over everything first, so the writer is measured alone
            for r in batch:
                recorder.record(r)
            accepted = time.perf_counter()
            cpu = time.process_time()
        recorder.flush()
        # The flushing thread sleeps in a wait, so the process's CPU time is the writer's.
        writer_cpu = time.process_time() - cpu
        done = time.perf_counter()

        cycle_figures = []
        for gap in gaps_s:
            admission_cycle(snapshot)  # warm caches
            for mode, fn, caller in (
                ("eager", eager, eager_caller),
                ("record_later", deferred, deferred_caller),
            ):
                baseline, with_store = _interleaved_ms(
                    lambda: admission_cycle(snapshot),
                    lambda fn=fn: fn(recorder),  # type: ignore[misc]
                    cycles,
                    gap,
                )
                recorder.flush()
                caller_ms = _fastest_ms(lambda c=caller: c(recorder), cycles)  # type: ignore[misc]
                recorder.flush()
                cycle_figures.append(
                    CycleFigures(mode, gap * 1000, baseline, with_store, caller_ms)
                )
    return Figures(
        engine=name,
        record_ns=(accepted - start) / records * 1e9,
        writer_cpu_us=writer_cpu / records * 1e6,
        transitions_per_s=records / (done - start),
        records_per_cycle=records_per_cycle,
        cycles=cycle_figures,
    )


@contextmanager
def postgres_store(url: str) -> Iterator[Engine]:
    """A migrated, throw-away schema in the PostgreSQL database at `url`."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    engine = make_engine(make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}))
    try:
        migrate.upgrade(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@contextmanager
def sqlite_store(directory: Path) -> Iterator[Engine]:
    """A migrated SQLite file in `directory`."""
    engine = make_engine(f"sqlite:///{directory / 'history-bench.db'}")
    try:
        migrate.upgrade(engine)
        yield engine
    finally:
        engine.dispose()


def run(
    postgres_url: str | None,
    records: int,
    cycles: int,
    gaps_ms: tuple[float, ...] = (50.0, 0.0),
    out: Callable[[str], None] = print,
) -> list[Figures]:
    """Measure SQLite and (unless `postgres_url` is None) PostgreSQL; print the figures."""
    results: list[Figures] = []
    gaps_s = [g / 1000 for g in gaps_ms]
    with tempfile.TemporaryDirectory(prefix="muster-history-bench-") as tmp:
        spool = Path(tmp) / "spool"
        with sqlite_store(Path(tmp)) as engine:
            results.append(measure(engine, "sqlite", records, cycles, gaps_s, spool))
        if postgres_url is not None:
            out(f"postgresql: {display_url(make_url(postgres_url))}")
            with postgres_store(postgres_url) as engine:
                results.append(measure(engine, "postgresql", records, cycles, gaps_s, spool))
    snapshot = cycle_snapshot()
    out(f"writes: {records} transitions per engine, recorded as fast as the caller can")
    out(
        f"{'engine':<11} {'record() ns/call':>16} {'writer CPU us/record':>21} "
        f"{'sustained transitions/s':>24}"
    )
    for f in results:
        out(
            f"{f.engine:<11} {f.record_ns:>16.0f} {f.writer_cpu_us:>21.1f} "
            f"{f.transitions_per_s:>24,.0f}"
        )
    out(
        f"admission cycle: {len(snapshot.pending)} pending workloads in {len(snapshot.queues)} "
        f"queues, {results[0].records_per_cycle} records per cycle, fastest of {cycles} cycles; "
        "gap = idle time between cycles (0 = back to back); caller = recording's own cost on "
        "the loop's thread"
    )
    out(
        f"{'engine':<11} {'recording':<13} {'gap ms':>6} {'cycle ms':>9} {'+store ms':>9} "
        f"{'overhead':>8} {'caller ms':>9} {'caller %':>8}"
    )
    for f in results:
        for c in f.cycles:
            out(
                f"{f.engine:<11} {c.mode:<13} {c.gap_ms:>6.0f} {c.cycle_ms:>9.1f} "
                f"{c.with_store_ms:>9.1f} {c.overhead_pct:>7.1f}% {c.caller_ms:>9.2f} "
                f"{c.caller_pct:>7.1f}%"
            )
    return results
