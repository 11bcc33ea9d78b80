"""The informers' caches are shared by every thread and changed by none (issue 24): the
admission loop, its writers, the scheduler's view and the informers' own updates run at once,
on real threads, and every Workload ends decided, with no failed cycle.

The first admission cycle to see a new Workload deep-copies it to assume its admission while
the scheduler reads the same cached object; when the scheduler's read added an empty status
to it in place, the copy failed ("dictionary changed size during iteration"), the cycle with
it, and that Workload was never decided again. This runs the whole loop for a few seconds;
MUSTER_STRESS_SECONDS makes it run longer (the issue asks for minutes:
`MUSTER_STRESS_SECONDS=300 .venv/bin/pytest tests/unit/test_cache_concurrency.py`).
"""

from __future__ import annotations

import bisect
import copy
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controllers.admission.loop import AdmissionLoop
from controllers.runtime import apply
from controllers.runtime.events import EventRecorder
from controllers.runtime.frozen import FrozenDict
from controllers.runtime.resources import (
    CLUSTER_QUEUE,
    LOCAL_QUEUE,
    RESOURCE_FLAVOR,
    WORKLOAD,
    Kind,
    Obj,
)
from controllers.scheduler.nodeview import Parsed, build_view
from controllers.state import workloads as wls
from controllers.state.caches import Caches, Context
from tests.unit.controller_fakes import FakeKube, _matches

SECONDS = float(os.environ.get("MUSTER_STRESS_SECONDS", "12"))
NAMESPACE = "team-a"


class WatchedKube(FakeKube):
    """The in-memory apiserver with watches, so that real informers run on their threads:
    every write is an event, in resourceVersion order."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition(self._lock)
        self._events: list[tuple[int, str, Obj]] = []  # (resourceVersion, kind, event)

    def _event(self, kind: Kind, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._events.append((rv, kind.name, {"type": type_, "object": copy.deepcopy(obj)}))
        self._changed.notify_all()

    def put(self, kind: Kind, obj: Obj) -> Obj:
        with self._lock:
            stored = super().put(kind, obj)
            self._event(kind, "ADDED", stored)
            return stored

    def patch(self, kind: Kind, *args: Any, **kwargs: Any) -> Obj:
        with self._lock:
            written = super().patch(kind, *args, **kwargs)
            self._event(kind, "MODIFIED", written)
            return written

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> tuple[Any, Iterator[Obj]]:
        deadline = time.monotonic() + timeout_seconds

        def events() -> Iterator[Obj]:
            with self._lock:
                at = bisect.bisect_right(
                    self._events, int(resource_version or 0), key=lambda e: e[0]
                )
            while time.monotonic() < deadline:
                with self._changed:
                    if at == len(self._events):
                        self._changed.wait(0.05)
                    fresh, at = self._events[at:], len(self._events)
                for _, kind_name, event in fresh:
                    if kind_name == kind.name and (
                        not label_selector or _matches(event["object"], label_selector)
                    ):
                        yield copy.deepcopy(event)  # each watch decodes its own

        return None, events()


def workload(index: int, cpu: int) -> Obj:
    """A Workload as a Job's reconciler creates it and the apiserver keeps it: scheduling
    fields in its pod set, the fields' managers (which make copying it take a while, as a
    real one does)."""
    terms = [
        {"matchExpressions": [{"key": f"zone-{i}", "operator": "In", "values": ["a", "b"]}]}
        for i in range(6)
    ]
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": f"w-{index}",
            "namespace": NAMESPACE,
            "labels": {f"label-{i}": "x" for i in range(8)},
            "managedFields": [
                {
                    "manager": f"manager-{i}",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {f"f:label-{j}": {} for j in range(8)}}
                    },
                }
                for i in range(4)
            ],
        },
        "spec": {
            "queueName": "team",
            "priority": index % 3,
            "podSets": [
                {
                    "name": "main",
                    "count": cpu,
                    "requests": {"cpu": "1"},
                    "template": {
                        "nodeSelector": {"pool": "a"},
                        "tolerations": [{"key": "gpu", "operator": "Exists"}],
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": terms
                                }
                            }
                        },
                    },
                }
            ],
        },
    }


class FailedCycles(logging.Handler):
    """Errors the loops log (a failed admission cycle, a failed write)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.messages.append(f"{record.name}: {record.getMessage()}: {error!r}")


@pytest.fixture
def fine_grained_switching() -> Iterator[None]:
    """Threads take turns every few microseconds, not every 5 ms: the interleavings a busy
    controller meets in minutes come in seconds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("fine_grained_switching")
def test_every_workload_is_decided_while_the_loop_the_writers_and_the_informers_race() -> None:
    kube = WatchedKube()
    kube.put(
        RESOURCE_FLAVOR,
        {"metadata": {"name": "pool"}, "spec": {"nodeLabels": {"pool": "a"}}},
    )
    # Room for most of what comes; the big ones never fit and wait, with a reason.
    kube.put(
        CLUSTER_QUEUE,
        {
            "metadata": {"name": "cq"},
            "spec": {"flavors": [{"name": "pool", "quota": {"cpu": "1000000"}}]},
        },
    )
    kube.put(
        LOCAL_QUEUE,
        {"metadata": {"name": "team", "namespace": NAMESPACE}, "spec": {"clusterQueue": "cq"}},
    )
    caches = Caches.create(kube, watch_timeout=1)
    caches.start()
    caches.wait_synced(10)
    ctx = Context(kube=kube, caches=caches, events=EventRecorder(None, "test"), identity="test")
    loop = AdmissionLoop(
        ctx, use_node_capacity=False, min_interval=0.0, resync=0.1, status_interval=0.05
    )
    caches.workloads.add_handler(lambda *_: loop.poke())
    errors = FailedCycles()
    logging.getLogger("controllers").addHandler(errors)
    stop = threading.Event()
    crashes: list[BaseException] = []

    def repeat(once: Any, pause: float) -> Any:
        """Run `once` until stopped, a random pause up to `pause` s apart (as a loop that is
        poked at odd moments runs); what it raises fails the test."""

        def run() -> None:
            while not stop.wait(random.uniform(0, pause)):
                try:
                    once()
                except Exception as error:
                    crashes.append(error)

        return run

    parsed = Parsed()

    def scheduler_view() -> None:
        """The scheduler's view of the same caches (what its pass reads, on its thread)."""
        build_view(caches, parsed, {}, [])

    def relabel() -> None:
        """Someone else's writes: labels on Workloads the loop is deciding, which the watch
        brings back as new versions (and which conflict with the loop's own writes)."""

        def touch(w: Obj) -> bool:
            w["metadata"]["labels"]["touched"] = str(time.monotonic())
            return True

        for key in caches.workloads.list_keys()[-20:]:
            apply.update(kube, WORKLOAD, key, touch, cache=caches.workloads)

    loop.start_writers(lambda: True)
    threads = [
        threading.Thread(target=loop.run, args=(stop, lambda: True), name="admission"),
        threading.Thread(target=repeat(scheduler_view, 0.1), name="scheduler"),
        threading.Thread(target=repeat(relabel, 0.01), name="relabel"),
    ]
    for thread in threads:
        thread.start()
    created: list[str] = []
    try:
        deadline = time.monotonic() + SECONDS
        # For SECONDS, and for enough Workloads to mean something on a slow machine too.
        while time.monotonic() < deadline or len(created) < 500:
            # A burst, as a user's batch of Jobs makes them.
            for _ in range(25):
                index = len(created)
                cpu = 2_000_000 if index % 50 == 7 else 1 + index % 4
                kube.create(WORKLOAD, NAMESPACE, workload(index, cpu))
                created.append(f"{NAMESPACE}/w-{index}")
            time.sleep(0.02)

        def undecided() -> list[str]:
            return [
                key
                for key in created
                if wls.condition(
                    kube.get(WORKLOAD, NAMESPACE, key.split("/")[1]) or {}, wls.QUOTA_RESERVED
                )
                is None
            ]

        settle = time.monotonic() + 20
        while undecided() and time.monotonic() < settle:
            time.sleep(0.2)
        left = undecided()
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        loop.stop()
        caches.stop()
        logging.getLogger("controllers").removeHandler(errors)

    problems = [f"{len(left)} of {len(created)} Workloads never decided: {left[:3]}"] * bool(left)
    problems += [f"a reader failed: {error!r}" for error in crashes[:2]]
    problems += errors.messages[:2]
    assert not problems, "\n".join(problems)
    admitted = [kube.get(WORKLOAD, NAMESPACE, key.split("/")[1]) or {} for key in created]
    assert sum(map(wls.has_quota, admitted)) >= len(created) * 0.9, "the small ones fit"


def test_a_cached_object_refuses_every_change_and_copies_into_a_plain_one() -> None:
    kube = FakeKube()
    caches = Caches.create(kube)
    stored = kube.put(WORKLOAD, workload(1, 1))
    caches.workloads.write_through(stored)
    cached = caches.workloads.get(f"{NAMESPACE}/w-1")
    assert cached is not None and isinstance(cached, FrozenDict)
    assert cached is not stored, "the cache keeps a copy of its own"
    meta = {k: v for k, v in stored["metadata"].items() if k != "managedFields"}
    assert stored["metadata"]["managedFields"], "the stored object has them"
    assert cached == {**stored, "metadata": meta}, "all but managedFields (never read)"
    with pytest.raises(TypeError, match="never changed in place"):
        wls.status_of(cached)  # a reader that would add an empty status
    with pytest.raises(TypeError):
        cached["spec"]["podSets"][0]["count"] = 2
    with pytest.raises(TypeError):
        cached["metadata"]["labels"].pop("label-1")
    with pytest.raises(TypeError):
        cached["spec"]["podSets"].append({})
    mine = copy.deepcopy(cached)
    assert wls.mark_pending(mine, "Pending", "waits", wls.now_utc())
    assert type(mine) is dict and type(mine["spec"]["podSets"]) is list
    assert wls.condition(mine, wls.QUOTA_RESERVED) is not None
    assert wls.condition(caches.workloads.get(f"{NAMESPACE}/w-1") or {}, wls.QUOTA_RESERVED) is None
