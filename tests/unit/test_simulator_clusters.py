"""Scenarios with worker clusters: a dispatching queue's workloads are admitted by quota over
the workers' capacity, then sent whole to one worker where they fit, bin-packed, or wait with
the dispatcher's reason; the management cluster's own queues keep its own nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import quota.simulation.simulator as simulator_module
from controllers.main import main
from controllers.simreport.history import history_records
from controllers.simreport.html import render_html
from quota.api import ManifestError
from quota.dispatch import Dispatched, NoCluster
from quota.simulation.report import cluster_stats, to_json
from quota.simulation.results import JobOutcome, SimResult
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multicluster.yaml"
GPU = "nvidia.com/gpu"
SIM = "simulate.muster.dev/v1alpha1"
API = "muster.dev/v1alpha1"
NO_ROOM = "no worker cluster can take"


def flavor() -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ResourceFlavor",
        "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"pool": "h100"}},
    }


def cluster(name: str, nodes: int, gpus: int = 8, **labels: str) -> dict[str, Any]:
    """A worker cluster with one pool of `nodes` nodes of `gpus` GPUs."""
    pools = [
        {
            "name": f"{name}-gpu",
            "count": nodes,
            "labels": {"pool": "h100"},
            "allocatable": {GPU: gpus},
        }
    ]
    return {
        "apiVersion": SIM,
        "kind": "Cluster",
        "metadata": {"name": name, "labels": labels or {"name": name}},
        "spec": {"nodePools": pools if nodes else []},
    }


def queue(name: str, quota: int, selector: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"flavors": [{"name": "h100", "quota": {GPU: quota}}]}
    if selector is not None:
        spec["dispatch"] = {"clusterSelector": selector}
    return [
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec},
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": name},
            "spec": {"clusterQueue": name},
        },
    ]


def job(
    namespace: str, name: str, pods: int, gpus: int, at: str = "0s", run: str = "10m"
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"muster.dev/queue-name": "q"},
            "annotations": {"muster.dev/submit-at": at, "muster.dev/run-for": run},
        },
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "spec": {"containers": [{"name": "c", "resources": {"requests": {GPU: gpus}}}]}
            },
        },
    }


def run(*docs: dict[str, Any]) -> SimResult:
    return simulate(parse_scenario(list(docs)))


def outcomes(result: SimResult) -> dict[str, JobOutcome]:
    return {j.key.split("/", 1)[1]: j for j in result.jobs}


@pytest.fixture
def choices(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Every choice the simulator's dispatch made, with the workload it was for."""
    seen: list[tuple[str, Any]] = []
    real = simulator_module.choose_cluster

    def spy(workload: Any, *args: Any, **kwargs: Any) -> Dispatched | NoCluster:
        choice = real(workload, *args, **kwargs)
        seen.append((workload.key, choice))
        return choice

    monkeypatch.setattr(simulator_module, "choose_cluster", spy)
    yield seen


# ---------------------------------------------------------------------- the example


def test_the_example_runs_its_story() -> None:
    scenario = parse_scenario(list(yaml.safe_load_all(EXAMPLE.read_text())))
    assert [c.name for c in scenario.clusters] == ["east", "west"]
    assert scenario.dispatch_to == {"research": ("east", "west"), "prod": ("east",)}
    result = simulate(scenario)
    jobs = outcomes(result)
    sweeps = sorted(jobs[f"sweep-gpu5-{i}"].cluster or "" for i in range(1, 7))
    assert sweeps == ["east"] * 4 + ["west"] * 2  # west, the fullest, first
    wide = jobs["wide-gang"]
    assert (wide.cluster, wide.admitted_at, wide.waited) == ("west", 1800.0, 1740.0)
    assert wide.last_pending_reason.startswith(NO_ROOM)
    assert "no node has 4 free" in wide.last_pending_reason
    assert wide.placement_wait == 1740.0  # a wait for room, as the report counts them
    assert (jobs["big-train"].cluster, jobs["big-train"].admitted_at) == ("east", 2400.0)
    prod = jobs["prod-serve"]
    assert (prod.cluster, prod.admitted_at) == ("east", 6000.0)  # west had room; not its
    assert "east:" in prod.last_pending_reason and "west" not in prod.last_pending_reason
    assert jobs["nightly-report"].cluster is None  # ops runs on the management cluster
    assert result.finished_all
    stats = {c.name: c for c in cluster_stats(result)}
    assert (stats["east"].workloads, stats["west"].workloads) == (6, 3)
    assert stats["east"].capacity == {GPU: 32} and stats["west"].capacity == {GPU: 16}
    # east: 4 x 5 GPUs for 30m, 32 for 1h, 8 for 30m, over 2h10m.
    assert stats["east"].avg_used[GPU] == pytest.approx((20 * 1800 + 32 * 3600 + 8 * 1800) / 7800)


def test_the_example_reports_clusters_in_json_table_and_history() -> None:
    result = simulate(parse_scenario(list(yaml.safe_load_all(EXAMPLE.read_text()))))
    data = to_json(result)
    by_name = {w["name"]: w for w in data["workloads"]}
    assert by_name["research/big-train"]["cluster"] == "east"
    assert "cluster" not in by_name["ops/nightly-report"]
    assert data["clusters"]["west"]["labels"] == {"region": "west"}
    assert data["clusters"]["east"]["utilisation"][GPU] == pytest.approx(0.663, abs=1e-3)
    assert data["placement"]["mode"] == "nodes"
    dispatched = [t for t in result.transitions if t.kind == "dispatched"]
    assert {t.actor for t in dispatched} == {"east", "west"}
    assert len(dispatched) == 9
    kinds = {str(getattr(r, "kind", "")) for r in history_records(result)}
    assert "dispatched" in kinds
    page = render_html(result)
    assert "sent to worker cluster east" in page
    out = CliRunner().invoke(main, ["simulate", str(EXAMPLE), "--no-history"])
    assert out.exit_code == 0, out.output
    assert "Worker clusters (2)" in out.output and "region=east" in out.output
    out = CliRunner().invoke(main, ["simulate", str(EXAMPLE), "--no-history", "-o", "json"])
    assert json.JSONDecoder().raw_decode(out.output)[0]["clusters"]["east"]["nodes"] == 4


# ------------------------------------------------------------------ where jobs land


def test_jobs_land_only_in_clusters_where_they_fit(choices: list[tuple[str, Any]]) -> None:
    result = run(
        flavor(),
        cluster("small", 2, gpus=4),
        cluster("big", 2, gpus=8),
        *queue("team", 64, {}),
        job("team", "whole-node", 1, 8),  # an 8-GPU pod: only big's nodes hold it
        job("team", "pair", 2, 4),  # fits both: small is the fuller after it
        job("team", "wide", 3, 8, at="1m"),  # 24 GPUs in one cluster: none has them
    )
    jobs = outcomes(result)
    assert jobs["whole-node"].cluster == "big"
    assert jobs["pair"].cluster == "small"
    assert jobs["wide"].cluster is None and jobs["wide"].admitted_at is None
    assert jobs["wide"].last_pending_reason.startswith(f"{NO_ROOM} the whole gang of 3 pods now")
    assert "big:" in jobs["wide"].last_pending_reason
    assert "small:" in jobs["wide"].last_pending_reason
    scenario_nodes = {n.name: c.name for c in result.clusters for n in c.nodes}
    for key, choice in choices:
        if isinstance(choice, Dispatched):
            pods = [n for pairs in choice.placement.nodes.values() for n in pairs]
            assert {scenario_nodes[node] for node, _ in pods} == {choice.cluster}, key


def test_a_gang_is_never_split_across_clusters() -> None:
    """Two clusters of one 8-GPU node each, 16 GPUs of quota: a gang of 2 x 8 GPUs would fit
    the fleet split in two, and never runs."""
    result = run(
        flavor(),
        cluster("a", 1),
        cluster("b", 1),
        *queue("team", 16, {}),
        job("team", "gang", 2, 8),
    )
    (gang,) = result.jobs
    assert gang.admitted_at is None and gang.cluster is None
    assert gang.last_pending_reason.startswith(NO_ROOM)
    assert not result.node_events  # not one pod of it bound anywhere
    assert result.capacity[("h100", GPU)] == 16


def test_bin_packing_fills_one_cluster_before_the_next() -> None:
    result = run(
        flavor(),
        cluster("a", 1),
        cluster("b", 1),
        *queue("team", 16, {}),
        *(job("team", f"small-{i}", 1, 2) for i in range(4)),
        job("team", "whole", 1, 8, at="1s"),
    )
    jobs = outcomes(result)
    assert {jobs[f"small-{i}"].cluster for i in range(4)} == {"a"}  # ties by name, then fullest
    assert jobs["whole"].cluster == "b"
    assert jobs["whole"].waited == 0.0


def test_finished_workloads_free_their_room_in_their_cluster() -> None:
    # "spare" adds to the capacity quota is shared out of, and the queue cannot use it.
    result = run(
        flavor(),
        cluster("only", 1),
        cluster("spare", 1),
        *queue("team", 16, {"matchLabels": {"name": "only"}}),
        job("team", "first", 1, 8, run="10m"),
        job("team", "second", 1, 8, at="1s", run="10m"),
    )
    jobs = outcomes(result)
    assert (jobs["first"].cluster, jobs["first"].finished_at) == ("only", 600.0)
    assert (jobs["second"].cluster, jobs["second"].admitted_at) == ("only", 600.0)
    assert jobs["second"].waited == 599.0
    assert jobs["second"].last_pending_reason.startswith(NO_ROOM)
    # Quota was reserved all along (admitted by quota at 1s), the pods ran from 600s.
    admitted = [t for t in result.transitions if t.job == "team/second" and t.kind == "admitted"]
    assert [t.at for t in admitted] == [1.0]


def test_the_selector_picks_the_clusters() -> None:
    result = run(
        flavor(),
        cluster("east", 1, region="east"),
        cluster("west", 2, region="west"),
        *queue("east-only", 16, {"matchLabels": {"region": "east"}}),
        *queue("anywhere", 16, {}),
        job("anywhere", "a", 1, 8),
        job("east-only", "b", 1, 8, at="1s"),
    )
    jobs = outcomes(result)
    assert jobs["a"].cluster == "east"  # the fullest: 0 left there, 8 in west
    assert jobs["b"].cluster == "east" and jobs["b"].admitted_at == 600.0


# ------------------------------------------------------------------------ quota


def test_the_capacity_of_workers_counts_for_quota() -> None:
    """A queue with no quota of its own borrows the fleet's idle GPUs, the workers' included,
    and no more than they are."""
    result = run(
        flavor(),
        cluster("a", 1),
        cluster("b", 1),
        *queue("burst", 0, {}),
        job("burst", "fits", 1, 8),
        job("burst", "more-than-the-fleet", 3, 8),
    )
    assert result.capacity[("h100", GPU)] == 16
    jobs = outcomes(result)
    assert jobs["fits"].cluster is not None
    too_big = jobs["more-than-the-fleet"]
    assert too_big.admitted_at is None
    assert not too_big.last_pending_reason.startswith(NO_ROOM)  # quota keeps it, not nodes


def test_a_waiting_dispatch_keeps_its_quota() -> None:
    """Admitted by quota and waiting for a cluster, a workload holds its quota: the next one
    of its queue waits on quota, not on clusters."""
    result = run(
        flavor(),
        cluster("a", 1),
        *queue("team", 8, {"matchLabels": {"name": "nowhere"}}),
        job("team", "first", 1, 8),
        job("team", "second", 1, 8, at="1s"),
    )
    jobs = outcomes(result)
    assert jobs["first"].last_pending_reason.startswith(
        "no worker cluster matches the queue's clusterSelector (name=nowhere)"
    )
    assert "none of the scenario's Clusters (a) carries the labels" in (
        jobs["first"].last_pending_reason
    )
    assert not jobs["second"].last_pending_reason.startswith("no worker cluster")
    assert jobs["second"].last_pending_reason


# -------------------------------------------------------------------- edge cases


def test_zero_workers_explained() -> None:
    result = run(
        flavor(),
        {
            "apiVersion": SIM,
            "kind": "NodePool",
            "metadata": {"name": "local"},
            "spec": {"count": 1, "labels": {"pool": "h100"}, "allocatable": {GPU: 8}},
        },
        *queue("remote", 8, {}),
        *queue("here", 8),
        job("remote", "sent", 1, 8),
        job("here", "local", 1, 8),
    )
    jobs = outcomes(result)
    assert jobs["sent"].admitted_at is None
    assert jobs["sent"].last_pending_reason.endswith("the scenario declares no Cluster")
    assert jobs["local"].cluster is None and jobs["local"].finished_at == 600.0
    assert result.clusters == () and "clusters" not in to_json(result)


def test_a_worker_with_no_nodes_takes_nothing() -> None:
    result = run(
        flavor(),
        cluster("empty", 0),
        cluster("one", 1),
        cluster("spare", 1),
        *queue(
            "team",
            16,
            {"matchExpressions": [{"key": "name", "operator": "In", "values": ["empty", "one"]}]},
        ),
        job("team", "a", 1, 8),
        job("team", "b", 1, 8, at="1s"),
    )
    jobs = outcomes(result)
    assert jobs["a"].cluster == "one" and jobs["b"].cluster == "one"
    assert jobs["b"].admitted_at == 600.0
    assert "empty:" in jobs["b"].last_pending_reason
    stats = {c.name: c for c in cluster_stats(result)}
    assert stats["empty"].nodes == 0 and stats["empty"].utilisation("cpu") is None


def test_a_one_node_worker_holds_a_gang_on_one_node() -> None:
    result = run(
        flavor(),
        cluster("one", 1),
        *queue("team", 8, {}),
        job("team", "gang", 2, 4),
    )
    (gang,) = result.jobs
    assert gang.cluster == "one" and gang.finished_at == 600.0
    used = [e.used.get(GPU, 0) for e in result.node_events]
    assert max(used) == 8 and used[-1] == 0


# -------------------------------------------------------------------- validation


def bad(*docs: dict[str, Any]) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_scenario(list(docs))
    return caught.value


def test_a_duplicate_cluster_is_named() -> None:
    error = bad(flavor(), cluster("a", 1), cluster("a", 1), *queue("team", 8, {}))
    assert error.index == 2 and error.subject == "Cluster a"
    assert error.problems[0][0] == "metadata.name"
    assert "duplicate: document 1 already defines Cluster a" in str(error)


@pytest.mark.parametrize(
    ("labels", "path", "rule"),
    [
        ({"bad key!": "x"}, "metadata.labels[bad key!]", "a label key is"),
        ({"region": "-east"}, "metadata.labels[region]", "a label value is"),
        ({"region": "x" * 64}, "metadata.labels[region]", "at most 63"),
    ],
)
def test_a_bad_label_is_named(labels: dict[str, str], path: str, rule: str) -> None:
    doc = cluster("a", 1)
    doc["metadata"]["labels"] = labels
    error = bad(flavor(), doc, *queue("team", 8, {}))
    assert (error.index, error.subject, error.problems[0][0]) == (1, "Cluster a", path)
    assert rule in error.problems[0][1]


def test_node_names_are_unique_across_the_scenario() -> None:
    local = {
        "apiVersion": SIM,
        "kind": "NodePool",
        "metadata": {"name": "a-gpu"},
        "spec": {"count": 1, "labels": {"pool": "h100"}, "allocatable": {GPU: 8}},
    }
    error = bad(flavor(), local, cluster("a", 1), *queue("team", 8, {}))
    assert (error.index, error.subject) == (2, "Cluster a")
    assert error.problems[0][0] == "spec.nodePools[0]"
    assert "node a-gpu-0 is also a Node or NodePool of the scenario" in error.problems[0][1]
    twin = cluster("b", 0)
    twin["spec"]["nodes"] = [
        {
            "metadata": {"name": "a-gpu-0", "labels": {"pool": "h100"}},
            "status": {"allocatable": {GPU: 8}},
        }
    ]
    error = bad(flavor(), cluster("a", 1), twin, *queue("team", 8, {}))
    assert error.problems[0][0] == "spec.nodes[0].metadata.name"
    assert "also a node of Cluster a" in error.problems[0][1]


@pytest.mark.parametrize(
    ("node", "path", "rule"),
    [
        ({"metadata": {"name": "n"}}, "spec.nodes[0].status.allocatable", "required"),
        (
            {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "lots"}}},
            "spec.nodes[0].status.allocatable[cpu]",
            "",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": 1}}},
            "spec.nodes[0]",
            "expected a Node",
        ),
    ],
)
def test_a_bad_node_of_a_cluster_is_named(node: dict[str, Any], path: str, rule: str) -> None:
    doc = cluster("a", 1)
    doc["spec"]["nodes"] = [node]
    error = bad(flavor(), doc, *queue("team", 8, {}))
    assert (error.index, error.subject) == (1, "Cluster a"), str(error)
    assert error.problems[0][0] == path, str(error)
    assert rule in error.problems[0][1]


def test_an_unknown_field_of_a_cluster_is_named() -> None:
    doc = cluster("a", 1)
    doc["spec"]["node"] = []
    error = bad(flavor(), doc, *queue("team", 8, {}))
    assert error.index == 1 and error.problems[0][0] == "spec.node"


def test_an_elastic_job_in_a_dispatching_queue_is_refused() -> None:
    elastic = job("team", "grow", 1, 8)
    elastic["metadata"]["annotations"]["muster.dev/elastic-job"] = "true"
    error = bad(flavor(), cluster("a", 1), *queue("team", 8, {}), elastic)
    assert error.subject == "Job team/grow"
    assert error.problems[0][0] == "metadata.labels[muster.dev/queue-name]"
    assert "dispatches to worker clusters" in error.problems[0][1]


def test_the_command_line_says_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    doc = cluster("a", 1)
    doc["metadata"]["labels"] = {"region": "-east"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([flavor(), doc, *queue("team", 8, {})]))
    out = CliRunner().invoke(main, ["simulate", str(path), "--no-history"])
    assert out.exit_code != 0
    assert "Traceback" not in out.output
    assert "Cluster a" in out.output and "metadata.labels[region]" in out.output


def test_an_evicted_workload_leaves_its_cluster_for_its_preemptor() -> None:
    docs = [flavor(), cluster("only", 1), *queue("team", 8, {})]
    docs[2]["spec"]["preemption"] = {"withinQueue": "LowerPriority", "waitBeforeEvicting": "0s"}
    urgent = job("team", "urgent", 1, 8, at="1m")
    urgent["spec"]["template"]["spec"]["priorityClassName"] = "high"
    high = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
    result = run(
        *docs,
        {**high, "metadata": {"name": "high"}, "value": 1000},
        urgent,
        job("team", "routine", 1, 8, run="1h"),
    )
    jobs = outcomes(result)
    assert (jobs["urgent"].cluster, jobs["urgent"].admitted_at) == ("only", 60.0)
    assert jobs["routine"].evictions == 1 and jobs["routine"].cluster == "only"
    assert jobs["routine"].admitted_at == 0.0 and jobs["routine"].finished_at is not None
    # No instant has more than the node's 8 GPUs in use.
    assert max(e.used.get(GPU, 0) for e in result.node_events) == 8
