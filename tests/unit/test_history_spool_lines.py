"""The spool's lines: workload transitions in the compact form, other records as tagged
dicts, lines of either form read back as the same records, and a compact line that does not
fit its tag set aside, not read wrongly."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from controllers.history.records import (
    PlacementDecision,
    TransitionKind,
    WorkloadTransition,
    record_to_dict,
)
from controllers.history.spoollines import parse_lines, spool_line

AT = datetime(2026, 11, 24, 2, 0, 0, 123456, tzinfo=UTC)
TRANSITION = WorkloadTransition(
    namespace="team",
    name="job-1",
    uid="uid-1",
    kind=TransitionKind.EVICTED,
    at=AT,
    sequence=2,
    local_queue="lq",
    cluster_queue="cq",
    flavors={"nvidia.com/gpu": "h100"},
    resources={"nvidia.com/gpu": 8, "cpu": 16_000},
    reason="preempted by team/urgent",
    actor="team/urgent",
)
PLACEMENT = PlacementDecision(
    namespace="team", name="job-1", uid="uid-1", pod_group="pg", at=AT, assignments={"n1": 2}
)


def test_lines_read_back_as_the_records_written() -> None:
    lines = [spool_line(TRANSITION), spool_line(PLACEMENT)]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    assert json.loads(lines[0])[0] == "t1", "transitions are written in the compact form"
    records, rejected = parse_lines([line.rstrip("\n") for line in lines])
    assert records == [TRANSITION, PLACEMENT] and rejected == []


def test_tagged_dict_lines_of_transitions_are_still_read() -> None:
    old = json.dumps(record_to_dict(TRANSITION))
    assert parse_lines([old]) == ([TRANSITION], [])


def test_a_compact_line_that_does_not_fit_its_tag_is_set_aside() -> None:
    short = json.dumps(json.loads(spool_line(TRANSITION))[:-1])
    records, rejected = parse_lines([short])
    assert records == [] and len(rejected) == 1
    assert "t1" in rejected[0] and "error" in json.loads(rejected[0])
