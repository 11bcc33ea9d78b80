"""Which Workloads the orphan sweeper treats as left behind by `--cascade=orphan`."""

from __future__ import annotations

from controllers.jobs.orphans import orphaned_uid
from quota.api.names import JOB_UID_LABEL


def _wl(labels: dict[str, str], owners: list[dict[str, str]]) -> dict[str, object]:
    return {
        "metadata": {"name": "w", "namespace": "ns", "labels": labels, "ownerReferences": owners}
    }


def test_only_muster_made_workloads_without_an_owner_are_orphans() -> None:
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u1"}]
    assert orphaned_uid(_wl({JOB_UID_LABEL: "u1"}, [])) == "u1"
    assert orphaned_uid(_wl({JOB_UID_LABEL: "u1"}, owner)) is None  # still owned
    assert orphaned_uid(_wl({}, [])) is None  # written by hand: never touched
