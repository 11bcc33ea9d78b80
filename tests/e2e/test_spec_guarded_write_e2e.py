"""Writes conditional on the spec (issue 14, writes per admitted Job), on the real apiserver.

Muster unsuspends a Job with a JSON patch whose `test` operations require the uid and
metadata.generation it read. These cases hold the apiserver to what that relies on: the Job
controller's status write does not move the generation (so it no longer makes the
unsuspension conflict), a spec change does (so a change worked out over an old spec is
refused and worked out again), a failed `test` is told apart from other refusals, and an
annotations map that was absent tests equal to null (so one created meanwhile is not
overwritten).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from controllers.runtime import apply
from controllers.runtime.client import api_client
from controllers.runtime.resources import JOB, Kind, Kube, Obj
from tests.conftest import ClusterHandle

pytestmark = pytest.mark.e2e


class CountingKube(Kube):
    """The real client, counting the writes it sends (refused ones included)."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(api_client(kubeconfig, pool_size=2))
        self.writes: list[str] = []

    def patch(
        self, kind: Kind, namespace: str | None, name: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        self.writes.append("merge")
        return super().patch(kind, namespace, name, patch, status=status)

    def patch_ops(self, kind: Kind, namespace: str | None, name: str, ops: Any) -> Obj:
        self.writes.append("json")
        return super().patch_ops(kind, namespace, name, ops)


@pytest.fixture
def kube(cluster: ClusterHandle) -> Iterator[CountingKube]:
    yield CountingKube(cluster.kubeconfig)


def _suspended_job(cluster: ClusterHandle, kube: Kube, namespace: str, name: str) -> Obj:
    """A suspended Job as first read, before the Job controller records its condition, and
    wait for that status write (the race the guard is for)."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "suspend": True,
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }
    created = kube.create(JOB, namespace, body)

    def suspended_recorded() -> bool:
        current = kube.get(JOB, namespace, name) or {}
        conditions = (current.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Suspended" for c in conditions)

    cluster.wait_for("the Job controller to record Suspended", suspended_recorded, timeout=30)
    return created


def _start(job: Obj) -> bool:
    """What starting an admitted Job changes: the spec and one annotation."""
    job["spec"]["suspend"] = False
    job["spec"]["template"]["spec"]["nodeSelector"] = {"muster-e2e/flavor": "a"}
    job["metadata"].setdefault("annotations", {})["muster.dev/original-scheduling"] = "{}"
    return True


def test_the_job_controllers_status_write_does_not_refuse_the_start(
    cluster: ClusterHandle, namespace: str, kube: CountingKube
) -> None:
    stale = _suspended_job(cluster, kube, namespace, "guarded")
    key = f"{namespace}/guarded"
    written = apply.update(kube, JOB, key, _start, current=stale, spec_guarded=True)
    assert written is not None and written["spec"]["suspend"] is False
    assert kube.writes == ["json"], "one write, though the status moved since it was read"

    # The same stale read with a resourceVersion precondition: refused, read, written again.
    stale = _suspended_job(cluster, kube, namespace, "versioned")
    kube.writes.clear()
    apply.update(kube, JOB, f"{namespace}/versioned", _start, current=stale)
    assert kube.writes == ["merge", "merge"]


def test_a_start_worked_out_over_an_old_spec_is_refused_and_worked_out_again(
    cluster: ClusterHandle, namespace: str, kube: CountingKube
) -> None:
    stale = _suspended_job(cluster, kube, namespace, "grown")
    kube.patch(JOB, namespace, "grown", {"spec": {"parallelism": 5}})
    kube.writes.clear()
    seen: list[int] = []

    def start(job: Obj) -> bool:
        seen.append(job["spec"]["parallelism"])
        return _start(job)

    written = apply.update(kube, JOB, f"{namespace}/grown", start, current=stale, spec_guarded=True)
    assert written is not None
    assert seen == [2, 5], "the refused change was worked out again over the new spec"
    assert kube.writes == ["json", "json"]
    assert written["spec"]["parallelism"] == 5 and written["spec"]["suspend"] is False


def test_an_annotations_map_created_meanwhile_is_kept(
    cluster: ClusterHandle, namespace: str, kube: CountingKube
) -> None:
    stale = _suspended_job(cluster, kube, namespace, "noted")
    assert not stale["metadata"].get("annotations")
    kube.patch(JOB, namespace, "noted", {"metadata": {"annotations": {"team": "a"}}})
    written = apply.update(
        kube, JOB, f"{namespace}/noted", _start, current=stale, spec_guarded=True
    )
    assert written is not None
    assert written["metadata"]["annotations"] == {
        "team": "a",
        "muster.dev/original-scheduling": "{}",
    }


def test_a_refusal_that_is_not_a_failed_test_is_raised(
    cluster: ClusterHandle, namespace: str, kube: CountingKube
) -> None:
    stale = _suspended_job(cluster, kube, namespace, "invalid")

    def invalid(job: Obj) -> bool:
        job["spec"]["parallelism"] = -1  # the apiserver's validation refuses it
        return True

    with pytest.raises(Exception) as raised:
        apply.update(
            kube,
            JOB,
            f"{namespace}/invalid",
            invalid,
            current=copy.deepcopy(stale),
            spec_guarded=True,
        )
    assert getattr(raised.value, "status", None) == 422
    assert kube.writes == ["json"], "not retried as if the spec had changed"
