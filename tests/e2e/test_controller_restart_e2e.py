"""Restarts and replicas: a controller killed mid-way and started again loses nothing and
admits nothing twice; of two replicas only the Lease holder ever admits; an unavailable
controller never blocks unrelated workloads, and labelled Jobs created meanwhile wait
suspended."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.conftest import ClusterHandle
from tests.e2e.controller_harness import (
    Controller,
    admitted,
    apply,
    crds,  # noqa: F401 - fixture
    finished,
    flavor,
    gated,
    get,
    job,
    live,
    local_queue,
    pods_of,
    unique,
    workloads_of,
)
from tests.e2e.controller_harness import cluster_queue as cq_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture
def started(
    cluster: ClusterHandle,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[Controller]]:
    """Controllers a test starts; all stopped at its end."""
    procs: list[Controller] = []
    yield procs
    for proc in procs:
        proc.stop()


def _start(
    cluster: ClusterHandle, procs: list[Controller], tmp: pytest.TempPathFactory, name: str
) -> Controller:
    ctl = Controller(cluster, tmp.mktemp(name), name).start()
    procs.append(ctl)
    return ctl


def _queue(cluster: ClusterHandle, namespace: str, cpu: str) -> str:
    pool = unique("restart")
    cluster.nodes(2, cpu="8", memory="32Gi", labels={"muster-e2e/pool": pool})
    cq = unique("cq")
    apply(
        cluster,
        flavor(pool, pool),
        cq_manifest(cq, [{"name": pool, "quota": {"cpu": cpu}, "limit": {"cpu": cpu}}]),
        local_queue("q", namespace, cq),
    )
    return cq


def _admissions(*controllers: Controller) -> Counter[str]:
    counts: Counter[str] = Counter()
    for ctl in controllers:
        for record in ctl.logged("admitted workload"):
            counts[record["workload"]] += 1
    return counts


def _state(cluster: ClusterHandle, namespace: str, names: list[str]) -> tuple[int, int]:
    """(admitted Jobs, unsuspended Jobs) among `names`."""
    wls = {
        w["metadata"]["labels"]["muster.dev/job-name"]: w
        for w in get(cluster, "workloads.muster.dev", "-n", namespace)["items"]
    }
    jobs = {j["metadata"]["name"]: j for j in get(cluster, "jobs", "-n", namespace)["items"]}
    n_admitted = sum(1 for n in names if n in wls and admitted(wls[n]))
    running = sum(1 for n in names if n in jobs and not jobs[n]["spec"].get("suspend"))
    return n_admitted, running


def test_killed_controller_restarts_without_losing_or_double_admitting(
    cluster: ClusterHandle,
    namespace: str,
    started: list[Controller],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _queue(cluster, namespace, cpu="4")
    first = _start(cluster, started, tmp_path_factory, unique("first"))
    first.wait_leading()
    names = [f"job-{i}" for i in range(8)]
    apply(cluster, *(job(n, namespace, "q", cpu="1") for n in names))
    # Killed while it is creating Workloads and admitting.
    time.sleep(0.5)
    first.kill()

    # While it is down, a labelled Job is still created suspended, for Muster's scheduler
    # (the apiserver applies Muster's admission policies itself), so nothing runs outside
    # quota; unrelated Jobs are not affected at all.
    apply(cluster, job("late", namespace, "q"))
    late = get(cluster, "job", "late", "-n", namespace)
    assert late["spec"]["suspend"] is True
    assert late["spec"]["template"]["spec"]["schedulerName"] == "muster-scheduler"
    cluster.kubectl("delete", "job", "late", "-n", namespace)
    apply(cluster, job("unrelated", namespace, None))
    assert not get(cluster, "job", "unrelated", "-n", namespace)["spec"].get("suspend")

    second = _start(cluster, started, tmp_path_factory, unique("second"))
    second.wait_leading()
    cluster.wait_for(
        "4 Jobs admitted and running, 4 waiting",
        lambda: _state(cluster, namespace, names) == (4, 4),
        timeout=90,
    )
    time.sleep(2)  # and it stays so: nothing is admitted on top
    assert _state(cluster, namespace, names) == (4, 4)
    wls = get(cluster, "workloads.muster.dev", "-n", namespace)["items"]
    assert len(wls) == 8, [w["metadata"]["name"] for w in wls]  # one per Job, none lost
    counts = _admissions(first, second)
    assert counts and max(counts.values()) == 1, counts

    # Freeing quota admits the waiting ones.
    running = [w["metadata"]["labels"]["muster.dev/job-name"] for w in wls if admitted(w)]
    cluster.kubectl("delete", "job", running[0], running[1], "-n", namespace)
    cluster.wait_for(
        "two more admitted",
        lambda: _state(cluster, namespace, [n for n in names if n not in running[:2]]) == (4, 4),
        timeout=60,
    )
    assert max(_admissions(first, second).values()) == 1


def test_elastic_scale_up_survives_a_controller_kill(
    cluster: ClusterHandle,
    namespace: str,
    started: list[Controller],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _queue(cluster, namespace, cpu="5")
    first = _start(cluster, started, tmp_path_factory, unique("first"))
    first.wait_leading()
    apply(cluster, job("el", namespace, "q", parallelism=2, elastic=True))

    def state() -> tuple[int, int]:
        pods = live(pods_of(cluster, namespace, "el"))
        ungated = sum(1 for p in pods if not gated(p))
        return ungated, len(pods) - ungated

    cluster.wait_for("2 pods ungated", lambda: state() == (2, 0))
    cluster.kubectl("patch", "job", "el", "-n", namespace, "-p", '{"spec":{"parallelism":5}}')
    time.sleep(0.3)
    first.kill()
    second = _start(cluster, started, tmp_path_factory, unique("second"))
    second.wait_leading()
    cluster.wait_for("5 pods ungated", lambda: state() == (5, 0), timeout=90)
    cluster.wait_for(
        "one active slice of 5, the first one replaced",
        lambda: (
            [
                (w["spec"]["podSets"][0]["count"], admitted(w))
                for w in workloads_of(cluster, namespace, "el")
                if not finished(w)
            ]
            == [(5, True)]
        ),
    )
    # Then 5 -> 7 under a limit of 5: the 2 new pods stay gated across another kill.
    cluster.kubectl("patch", "job", "el", "-n", namespace, "-p", '{"spec":{"parallelism":7}}')
    time.sleep(0.3)
    second.kill()
    third = _start(cluster, started, tmp_path_factory, unique("third"))
    third.wait_leading()
    cluster.wait_for("5 ungated, 2 gated", lambda: state() == (5, 2), timeout=90)
    time.sleep(2)
    assert state() == (5, 2)
    active = [w for w in workloads_of(cluster, namespace, "el") if not finished(w)]
    assert len(active) == 2
    assert sum(1 for w in active if admitted(w)) == 1
    assert max(_admissions(first, second, third).values()) == 1


def _ts(record: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(record["ts"]))


def test_two_replicas_never_both_admit(
    cluster: ClusterHandle,
    namespace: str,
    started: list[Controller],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _queue(cluster, namespace, cpu="16")
    a = _start(cluster, started, tmp_path_factory, unique("replica-a"))
    b = _start(cluster, started, tmp_path_factory, unique("replica-b"))
    cluster.wait_for("one replica to lead", lambda: a.leading() or b.leading(), timeout=60)
    leader, standby = (a, b) if a.leading() else (b, a)
    leader.wait_leading()
    batch1 = [f"one-{i}" for i in range(5)]
    apply(cluster, *(job(n, namespace, "q", cpu="1") for n in batch1))
    cluster.wait_for("batch 1 admitted", lambda: _state(cluster, namespace, batch1) == (5, 5))
    # An admission is logged once its write has returned, which may be just after the
    # apiserver shows it: killed in between, the leader would never log it.
    cluster.wait_for(
        "the leader to log batch 1's admissions",
        lambda: len(leader.logged("admitted workload")) >= 5,
        timeout=30,
    )
    assert not standby.leading()
    assert not standby.logged("admitted workload")

    leader.kill()
    standby.wait_leading(timeout=60)
    batch2 = [f"two-{i}" for i in range(5)]
    apply(cluster, *(job(n, namespace, "q", cpu="1") for n in batch2))
    cluster.wait_for("batch 2 admitted", lambda: _state(cluster, namespace, batch2) == (5, 5))

    counts = _admissions(leader, standby)
    assert len(counts) == 10 and max(counts.values()) == 1, counts
    took_over = _ts(standby.logged("became leader")[0])
    assert all(_ts(r) >= took_over for r in standby.logged("admitted workload"))
    assert {
        r["workload"].split("/")[1].rsplit("-", 1)[0] for r in leader.logged("admitted workload")
    } == {f"job-{n}" for n in batch1}
