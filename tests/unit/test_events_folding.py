"""Bursts of Events are folded: the first few per namespace, reason and kind are written one
by one, the rest of the window become one Event on the Namespace that names them."""

from __future__ import annotations

import time

from controllers.runtime.events import EventRecorder
from controllers.runtime.resources import EVENT
from tests.unit.controller_fakes import FakeKube


def job(name: str, namespace: str = "team") -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
    }


def written(kube: FakeKube, recorder: EventRecorder) -> list[dict[str, object]]:
    deadline = time.monotonic() + 5
    while recorder.backlog() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    items, _ = kube.list(EVENT)
    return items


def test_a_burst_writes_the_first_events_and_one_summary_naming_the_rest() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "me", burst=2, fold_window=60)
    recorder.start()
    try:
        for i in range(7):
            recorder.emit(job(f"j{i}"), "Normal", "Started", f"started j{i}")
        recorder.emit(job("other", "elsewhere"), "Normal", "Started", "started other")
        recorder.emit(job("j6"), "Warning", "Stopped", "suspended")
        one_by_one = written(kube, recorder)
        assert sorted(e["involvedObject"]["name"] for e in one_by_one) == [  # type: ignore[index]
            "j0",
            "j1",
            "j6",
            "other",
        ]
        assert recorder.folded == 5

        recorder.flush()
        events = written(kube, recorder)
        [summary] = [e for e in events if e["involvedObject"]["kind"] == "Namespace"]  # type: ignore[index]
        assert summary["involvedObject"]["name"] == "team"  # type: ignore[index]
        assert summary["metadata"]["namespace"] == "team"  # type: ignore[index]
        assert summary["reason"] == "Started" and summary["count"] == 5
        assert "5 more Jobs" in str(summary["message"])
        assert "j2, j3, j4, j5, j6" in str(summary["message"])
    finally:
        recorder.stop()


def test_without_folding_every_event_is_written() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "me", burst=0)
    recorder.start()
    try:
        for i in range(8):
            recorder.emit(job(f"j{i}"), "Normal", "Started", f"started j{i}")
        assert len(written(kube, recorder)) == 8
    finally:
        recorder.stop()
