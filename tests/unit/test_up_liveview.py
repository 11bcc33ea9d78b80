"""The live view's pieces that do not need a cluster: the compact queue table and the
decision lines."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console

from controllers.history.queries import TimelineEntry
from controllers.up.liveview import decision_line, queue_table


def _text(renderable: object) -> str:
    console = Console(width=120, record=True, no_color=True)
    console.print(renderable)
    return console.export_text()


def test_queues_show_gpus_per_flavor_children_under_their_parent() -> None:
    cqs = [
        {
            "metadata": {"name": "research"},
            "spec": {
                "parent": "org",
                "flavors": [{"name": "h100", "quota": {"nvidia.com/gpu": 0}}],
            },
            "status": {"pendingWorkloads": 2, "usage": {"h100": {"nvidia.com/gpu": "9"}}},
        },
        {
            "metadata": {"name": "org"},
            "spec": {
                "flavors": [
                    {"name": "h100", "quota": {"nvidia.com/gpu": 16, "cpu": 128}},
                    {"name": "cpu-pool", "quota": {"cpu": 32, "memory": "128Gi"}},
                ]
            },
            "status": {
                "admittedWorkloads": 3,
                "usage": {"h100": {"nvidia.com/gpu": "9", "cpu": "34"}},
                "fairShare": {"h100": {"nvidia.com/gpu": "12"}},
            },
        },
    ]
    lines = [line.strip() for line in _text(queue_table(cqs)).splitlines()]
    org = next(i for i, line in enumerate(lines) if line.startswith("org "))
    assert "h100 gpu 9/16 (12) · cpu-pool cpu 0/32" in lines[org]
    assert lines[org + 1].startswith("research") and "h100 gpu 9/0" in lines[org + 1]


def test_a_decision_reads_as_a_sentence_with_its_nodes_or_victims() -> None:
    at = datetime(2026, 11, 24, 3, 5, 9, tzinfo=UTC)
    placed = TimelineEntry(
        at=at,
        event="placed",
        namespace="ns",
        name="gang",
        cluster_queue="q",
        reason="",
        detail={"nodes": {"h100-1": 1, "h100-0": 2}},
    )
    # The same words the admission cycle's reasons use for where pods go.
    assert decision_line(placed) == "03:05:09  placed ns/gang on h100-0 (x2), h100-1"
    reclaimed = TimelineEntry(
        at=at,
        event="reclaimed",
        namespace="ns",
        name="small",
        cluster_queue="q",
        reason="Reclaimed: by queue product",
    )
    assert (
        decision_line(reclaimed)
        == "03:05:09  reclaimed (preempted) ns/small — Reclaimed: by queue product"
    )


def test_the_waiting_table_shows_a_requeued_workload_queued_with_its_current_reason() -> None:
    """Issue 25: once its pods are gone, a reclaimed Workload is listed as queued (since
    when, after what), with the reason it waits now, not as "being stopped"."""
    from datetime import timedelta

    from controllers.state import workloads as wls
    from controllers.up.liveview import _pending_table

    now = datetime(2026, 1, 1, 14, 5, 2, tzinfo=UTC)
    wl: dict[str, object] = {
        "metadata": {"name": "train", "namespace": "ns", "creationTimestamp": "t"},
        "spec": {"queueName": "q"},
    }
    admission = wls.admission_status("a", [("main", 1, {"cpu": "f"}, {"cpu": "1"})])
    assert wls.mark_admitted(wl, admission, "fits", now - timedelta(minutes=5))
    assert wls.mark_evicted(wl, "Reclaimed", "reclaimed by queue b", now, "ns/x")

    def shown() -> str:
        console = Console(width=300, record=True)
        console.print(_pending_table([wl]))
        return " ".join(console.export_text().split())

    assert "evicted (its pods are being stopped)" in shown()
    assert wls.release_quota(wl, now + timedelta(seconds=1))
    assert wls.mark_pending(wl, "Pending", "no room", now + timedelta(seconds=30))
    text = shown()
    assert (
        "queued (since 14:05:03, after an eviction by reclaim for ns/x; competes for quota "
        "since 14:05:04): Pending: no room"
    ) in text, text
    assert "being stopped" not in text
