"""What an operator asks after the fact: a workload's timeline, a queue's window, preemptions."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from controllers.history import queries
from controllers.history.records import (
    PlacementDecision,
    PreemptionDecision,
    QueueSample,
    Record,
    TransitionKind,
    Victim,
    WorkloadTransition,
)
from controllers.history.rows import write_records
from controllers.main import main
from tests.integration.conftest import Store

K = TransitionKind
GPU = "nvidia.com/gpu"
RECLAIM_REASON = "cq-b below its fair share of nvidia.com/gpu (0 of 8); cq-a above (16 of 8)"


def _train(kind: TransitionKind, at: datetime, seq: int = 0, **kw: object) -> WorkloadTransition:
    return WorkloadTransition(
        namespace="team-a",
        name="train-1",
        uid="uid-train-1",
        kind=kind,
        at=at,
        sequence=seq,
        local_queue="lq-a",
        cluster_queue="cq-a",
        flavors={GPU: "h100"},
        resources={GPU: 8, "cpu": 32_000},
        **kw,  # type: ignore[arg-type]
    )


def history_of_the_last_hours(now: datetime) -> list[Record]:
    """team-a/train-1 is admitted, placed, reclaimed for team-b/urgent, requeued, re-admitted."""

    def m(minutes: int) -> datetime:
        return now - timedelta(minutes=minutes)

    urgent: dict[str, Any] = {"namespace": "team-b", "name": "urgent", "uid": "uid-urgent"}
    return [
        _train(K.CREATED, m(50), reason="created by Job team-a/train-1"),
        _train(K.QUOTA_RESERVED, m(49), reason="quota reserved in cq-a"),
        _train(K.ADMITTED, m(49), reason="admitted by cq-a"),
        PlacementDecision(
            namespace="team-a",
            name="train-1",
            uid="uid-train-1",
            pod_group="train-1-pg",
            at=m(48),
            cluster_queue="cq-a",
            assignments={"gpu-node-1": 4, "gpu-node-2": 4},
            reason="placed 8 pods on 2 nodes",
        ),
        WorkloadTransition(
            **urgent, kind=K.CREATED, at=m(31), local_queue="lq-b", cluster_queue="cq-b"
        ),
        PreemptionDecision(
            **urgent,
            at=m(30),
            cluster_queue="cq-b",
            strategy="reclaim",
            reason=RECLAIM_REASON,
            victims=(Victim("team-a", "train-1", "uid-train-1", "cq-a", 0, "reclaimed"),),
        ),
        _train(K.RECLAIMED, m(30), reason=RECLAIM_REASON, actor="team-b/urgent"),
        WorkloadTransition(
            **urgent,
            kind=K.ADMITTED,
            at=m(29),
            local_queue="lq-b",
            cluster_queue="cq-b",
            flavors={GPU: "h100"},
            resources={GPU: 8},
        ),
        _train(K.REQUEUED, m(29), reason="requeued after reclaim"),
        _train(K.ADMITTED, m(10), seq=1, reason="admitted by cq-a after requeue"),
        _train(K.FINISHED, m(1), reason="Job succeeded"),
        # Long ago: outside every window asked about below.
        WorkloadTransition(
            namespace="team-a",
            name="old",
            uid="uid-old",
            kind=K.ADMITTED,
            at=now - timedelta(days=3),
            cluster_queue="cq-a",
        ),
        PreemptionDecision(
            namespace="team-c",
            name="old-urgent",
            uid="uid-old-urgent",
            at=now - timedelta(hours=3),
            cluster_queue="cq-c",
            victims=(Victim("team-c", "low", "uid-low", "cq-c"),),
        ),
        # cq-a held 16 GPUs against a fair share of 8 for the last two hours, sampled each minute.
        *(
            QueueSample(
                cluster_queue="cq-a",
                flavor="h100",
                resource=GPU,
                at=now - timedelta(minutes=i),
                usage=16,
                fair_share=8,
                demand=24,
                resolution_s=60,
            )
            for i in range(120)
        ),
    ]


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def recorded(migrated: Store, now: datetime) -> Store:
    with migrated.engine.begin() as conn:
        write_records(conn, history_of_the_last_hours(now))
    return migrated


def cli(store: Store, *args: str) -> str:
    result = CliRunner().invoke(
        main, [*args, "--database-url", store.url.render_as_string(hide_password=False)]
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_workload_timeline_tells_the_story_in_order(recorded: Store) -> None:
    timeline = queries.workload_timeline(recorded.engine, "team-a", "train-1")
    assert [e.event for e in timeline] == [
        "created",
        "quota_reserved",
        "admitted",
        "placed",
        "reclaimed",
        "requeued",
        "admitted",
        "finished",
    ]
    reclaimed = timeline[4]
    assert reclaimed.actor == "team-b/urgent"
    assert reclaimed.reason == RECLAIM_REASON
    assert timeline[3].detail["nodes"] == {"gpu-node-1": 4, "gpu-node-2": 4}
    assert timeline[2].resources == {GPU: 8, "cpu": 32_000}
    assert timeline[2].flavors == {GPU: "h100"}


def test_history_workload_command_prints_table_and_json(recorded: Store) -> None:
    table = cli(recorded, "history", "workload", "team-a/train-1")
    assert "reclaimed" in table and "team-b/urgent" in table and "gpu-node-1=4" in table
    data = json.loads(cli(recorded, "history", "workload", "team-a/train-1", "--output", "json"))
    assert [e["event"] for e in data][-1] == "finished"
    assert data[4]["actor"] == "team-b/urgent"
    datetime.fromisoformat(data[0]["at"])  # timestamps are ISO 8601


def test_queue_report_counts_the_window_and_compares_usage_to_fair_share(
    recorded: Store, now: datetime
) -> None:
    report = queries.queue_report(recorded.engine, "cq-a", now - timedelta(hours=24), now)
    # The admission three days ago is outside the window.
    assert report.counts == {
        "created": 1,
        "quota_reserved": 1,
        "admitted": 2,
        "reclaimed": 1,
        "requeued": 1,
        "finished": 1,
    }
    (gpu,) = report.usage
    assert (gpu.flavor, gpu.resource) == ("h100", GPU)
    assert gpu.average_usage == pytest.approx(16)
    assert gpu.average_fair_share == pytest.approx(8)
    assert gpu.peak_demand == 24
    assert gpu.observed_s == 120 * 60

    data = json.loads(cli(recorded, "history", "queue", "cq-a", "--since", "24h", "-o", "json"))
    assert data["counts"]["admitted"] == 2
    assert data["usage"][0]["average_usage"] == pytest.approx(16)
    wide = json.loads(cli(recorded, "history", "queue", "cq-a", "--since", "7d", "-o", "json"))
    assert wide["counts"]["admitted"] == 3
    table = cli(recorded, "history", "queue", "cq-a", "--since", "24h")
    assert "reclaimed 1" in table and "h100" in table


def test_preemptions_since_a_time_with_preemptor_and_victims(recorded: Store) -> None:
    data = json.loads(cli(recorded, "history", "preemptions", "--since", "1h", "-o", "json"))
    assert len(data) == 1
    (entry,) = data
    assert (entry["namespace"], entry["name"], entry["strategy"]) == ("team-b", "urgent", "reclaim")
    assert [(v["namespace"], v["name"]) for v in entry["victims"]] == [("team-a", "train-1")]
    assert (
        len(json.loads(cli(recorded, "history", "preemptions", "--since", "4h", "-o", "json"))) == 2
    )
    # Filtered by queue: the victim's queue counts as much as the preemptor's.
    for queue, expected in (("cq-a", 1), ("cq-b", 1), ("cq-c", 0)):
        out = cli(
            recorded, "history", "preemptions", "--since", "1h", "--queue", queue, "-o", "json"
        )
        assert len(json.loads(out)) == expected
    table = cli(recorded, "history", "preemptions", "--since", "1h")
    assert "team-a/train-1" in table and "reclaim" in table


def test_bad_arguments_get_errors_that_name_them(recorded: Store) -> None:
    url = recorded.url.render_as_string(hide_password=False)
    runner = CliRunner()
    bad_name = runner.invoke(main, ["history", "workload", "train-1", "--database-url", url])
    assert bad_name.exit_code != 0 and "NAMESPACE/NAME" in bad_name.output
    bad_since = runner.invoke(
        main, ["history", "queue", "cq-a", "--since", "yesterday", "--database-url", url]
    )
    assert bad_since.exit_code != 0 and "--since" in bad_since.output
    bad_url = runner.invoke(main, ["history", "preemptions", "--database-url", "mysql://x/y"])
    assert bad_url.exit_code != 0 and "--database-url" in bad_url.output
    unknown = runner.invoke(main, ["history", "workload", "team-a/nope", "--database-url", url])
    assert unknown.exit_code != 0 and "no history recorded" in unknown.output


def test_parse_since_accepts_durations_and_timestamps() -> None:
    now = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    assert queries.parse_since("90m", now) == now - timedelta(minutes=90)
    assert queries.parse_since("2w", now) == now - timedelta(weeks=2)
    assert queries.parse_since("2026-03-01T00:00:00", now) == datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="--since"):
        queries.parse_since("soon", now)
