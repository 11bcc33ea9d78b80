"""The simulator places pods on nodes, with the admission cycle's own placement: gangs wait for
whole nodes, fragmentation shows in the report, and no node ever holds more than it has."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers.cli.simulate import with_placement
from controllers.main import main
from controllers.simreport.html import render_html
from quota.simulation.report import node_timeline, to_json
from quota.simulation.results import TOTAL, SimResult
from quota.simulation.scenario import Scenario, parse_scenario
from quota.simulation.simulator import simulate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "placement-binpack-vs-spread.yaml"
GPU = "nvidia.com/gpu"
PLACEMENT_WAIT = "quota is available but the pods cannot be placed"


def nodes(count: int, gpus: int = 8) -> str:
    return f"""
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {{name: h100}}
spec: {{nodeLabels: {{pool: h100}}}}
---
apiVersion: simulate.muster.dev/v1alpha1
kind: NodePool
metadata: {{name: h100}}
spec: {{count: {count}, labels: {{pool: h100}}, allocatable: {{nvidia.com/gpu: {gpus}}}}}
"""


def queue(name: str, quota: int, placement: str = "BinPack") -> str:
    return f"""
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {{name: {name}}}
spec:
  placementStrategy: {placement}
  flavors: [{{name: h100, quota: {{nvidia.com/gpu: {quota}}}}}]
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {{name: q, namespace: {name}}}
spec: {{clusterQueue: {name}}}
"""


PRIORITIES = """
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 1
"""


def job(
    namespace: str,
    name: str,
    *,
    gpus: int,
    pods: int = 1,
    at: str = "0s",
    run: str = "100s",
    elastic: bool = False,
    priority: str | None = None,
) -> str:
    annotations = f"muster.dev/submit-at: {at}, muster.dev/run-for: {run}"
    if elastic:
        annotations += ', muster.dev/elastic-job: "true"'
    return f"""
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{muster.dev/queue-name: q}}
  annotations: {{{annotations}}}
spec:
  parallelism: {pods}
  template:
    spec:
      {f"priorityClassName: {priority}" if priority else ""}
      containers: [{{name: c, resources: {{requests: {{nvidia.com/gpu: {gpus}}}}}}}]
"""


def scale(job_key: str, at: str, parallelism: int) -> str:
    return f"""
---
apiVersion: simulate.muster.dev/v1alpha1
kind: ScaleEvent
metadata: {{name: scale-{at}}}
spec: {{job: {job_key}, at: {at}, parallelism: {parallelism}}}
"""


def load(text: str) -> Scenario:
    return parse_scenario(list(yaml.safe_load_all(text)))


def outcome(result: SimResult, key: str) -> dict[str, Any]:
    (found,) = [w for w in to_json(result)["workloads"] if w["name"] == key]
    return found


def use_at(result: SimResult, t: float, resource: str = GPU) -> dict[str, int]:
    """What each node has in use once every change at time `t` is applied."""
    assert result.nodes is not None
    used = {n.name: 0 for n in result.nodes}
    for event in result.node_events:
        if event.at > t:
            break
        used[event.node] = event.used.get(resource, 0)
    return used


def check_nodes_never_overfull(result: SimResult) -> None:
    """No node ever holds more than its allocatable (pod slots included), nor less than 0."""
    assert result.nodes is not None
    allocatable: Mapping[str, Mapping[str, int]] = {n.name: n.allocatable for n in result.nodes}
    last = 0.0
    for event in result.node_events:
        assert event.at >= last, "node events go forward in time"
        last = event.at
        for resource, amount in event.used.items():
            assert 0 <= amount <= allocatable[event.node].get(resource, 0), (event, resource)


# ------------------------------------------------------------------------ fragmentation

# Eight 8-GPU nodes; a Spread queue's small jobs take 4 GPUs on each of them for 600s; at 10s
# a gang of 4 pods x 8 GPUs arrives in a queue with all the quota it needs.
FRAGMENTED = (
    nodes(8)
    + queue("small", 32, placement="Spread")
    + queue("big", 32)
    + "".join(job("small", f"s{i}", gpus=4, run="600s") for i in range(8))
    + job("big", "gang", gpus=8, pods=4, at="10s", run="100s")
)


def test_a_gang_waits_for_whole_nodes_while_quota_is_free_then_runs_on_four_of_them() -> None:
    result = simulate(load(FRAGMENTED))
    assert set(use_at(result, 0).values()) == {4}  # 32 GPUs free, 4 on every node
    gang = outcome(result, "big/gang")
    assert gang["admittedAt"] == 600  # when the small jobs finish, not at 10s
    assert gang["lastPendingReason"].startswith(PLACEMENT_WAIT)
    assert "no node has 8 free" in gang["lastPendingReason"]
    assert gang["placementWait"] == 590
    big = to_json(result)["queues"]["big"]
    assert big["waitedForNodes"] == 1 and big["waitForNodesTotal"] == 590
    assert to_json(result)["queues"]["small"]["waitedForNodes"] == 0
    at_600 = use_at(result, 600)
    assert sorted(at_600.values()) == [0, 0, 0, 0, 8, 8, 8, 8]  # four whole nodes
    check_nodes_never_overfull(result)


def test_fragmentation_counts_free_gpus_on_partly_used_and_on_empty_nodes() -> None:
    result = simulate(load(FRAGMENTED))
    t = node_timeline(result, GPU)
    assert t is not None
    assert result.end == 700 and t.capacity == 64
    # 0-600s: 4 free on each of 8 partly used nodes; 600-700s: the gang fills 4 nodes and
    # leaves 4 empty.
    assert t.max_partial_free == 32
    assert t.avg_partial_free == pytest.approx(32 * 600 / 700)
    assert t.avg_whole_free == pytest.approx(32 * 100 / 700)
    assert t.partial_free[0] == 32 and t.partial_free[-1] == 0
    assert t.whole_free[-1] == 32
    assert len(t.nodes) == 8 and all(len(row) == len(t.edges) - 1 for row in t.used)
    placement = to_json(result)["placement"]
    assert placement["mode"] == "nodes" and placement["nodes"] == 8
    assert placement["waitedForNodes"] == 1
    assert placement["fragmentation"][GPU]["maxFreeOnPartlyUsedNodes"] == 32


def test_the_same_gang_runs_at_once_when_the_small_jobs_are_bin_packed() -> None:
    result = simulate(
        load(FRAGMENTED.replace("placementStrategy: Spread", "placementStrategy: BinPack"))
    )
    assert sorted(use_at(result, 0).values()) == [0, 0, 0, 0, 8, 8, 8, 8]
    gang = outcome(result, "big/gang")
    assert gang["admittedAt"] == 10 and gang["placementWait"] == 0


def test_a_gang_no_node_can_ever_hold_does_not_block_its_queue() -> None:
    text = (
        nodes(2)
        + queue("a", 32)
        + job("a", "huge", gpus=9, at="0s")
        + job("a", "fits", gpus=8, at="1s")
    )
    result = simulate(load(text))
    assert outcome(result, "a/fits")["admittedAt"] == 1
    huge = outcome(result, "a/huge")
    assert huge["admittedAt"] is None
    assert "the largest node has 8 allocatable" in huge["lastPendingReason"]


# ------------------------------------------------------------------- bin-pack vs spread


def test_spreading_the_example_makes_the_gangs_wait_for_whole_nodes() -> None:
    scenario = parse_scenario(list(yaml.safe_load_all(EXAMPLE.read_text())))
    packed = to_json(simulate(with_placement(scenario, "BinPack")))
    spread = to_json(simulate(with_placement(scenario, "Spread")))
    assert packed["queues"]["training"]["waitedForNodes"] == 0
    assert packed["queues"]["training"]["waitMax"] == 0
    assert spread["queues"]["training"]["waitedForNodes"] >= 3
    assert spread["queues"]["training"]["waitMax"] >= 25 * 60
    assert spread["queues"]["training"]["waitForNodesTotal"] >= 3600
    # Serving never waits either way: the stream always finds a GPU somewhere.
    assert packed["queues"]["serving"]["waitMax"] == spread["queues"]["serving"]["waitMax"] == 0
    # Spreading strands free GPUs on partly used nodes; packing keeps whole nodes free.
    frag_packed = packed["placement"]["fragmentation"][GPU]
    frag_spread = spread["placement"]["fragmentation"][GPU]
    assert frag_spread["avgFreeOnPartlyUsedNodes"] > 3 * frag_packed["avgFreeOnPartlyUsedNodes"]
    assert frag_packed["avgFreeOnEmptyNodes"] > frag_spread["avgFreeOnEmptyNodes"]


def test_the_placement_option_of_simulate_overrides_every_queue() -> None:
    def training(*extra: str) -> dict[str, Any]:
        args = ["simulate", str(EXAMPLE), "-o", "json", "--no-history", *extra]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout)["queues"]["training"])

    assert training()["waitMax"] == 0  # the file says BinPack
    assert training("--placement", "Spread")["waitMax"] > 0


# ------------------------------------------------------------------- elastic Jobs on nodes


def test_a_scale_up_adds_pods_next_to_the_running_ones_and_a_scale_down_removes_the_newest() -> (
    None
):
    text = (
        nodes(2)
        + queue("a", 16)
        + job("a", "train", gpus=4, pods=2, run="1000s", elastic=True)
        + scale("a/train", "100s", 4)
        + scale("a/train", "300s", 1)
    )
    result = simulate(load(text))
    start = use_at(result, 0)
    (first,) = [n for n, used in start.items() if used == 8]  # bin-packed on one node
    assert use_at(result, 100) == {n: 8 for n in start}  # the two new pods on the other
    # Scale-down removes the newest pods first: the other node empties, one pod stays.
    after = use_at(result, 300)
    assert after[first] == 4 and sum(after.values()) == 4
    train = outcome(result, "a/train")
    assert train["evictions"] == 0 and train["finishedAt"] == 1000
    assert set(use_at(result, 1000).values()) == {0}
    check_nodes_never_overfull(result)


def test_a_preemptor_takes_the_nodes_of_its_victim_once_the_victim_is_gone() -> None:
    text = (
        nodes(1)
        + queue("a", 8).replace(
            "placementStrategy",
            "preemption: {withinQueue: LowerPriority, waitBeforeEvicting: 0s}\n  placementStrategy",
        )
        + PRIORITIES
        + job("a", "batch", gpus=8, run="1000s", priority="low")
        + job("a", "urgent", gpus=8, at="50s", run="100s", priority="high")
        + """
---
apiVersion: simulate.muster.dev/v1alpha1
kind: Simulation
metadata: {name: evict}
spec: {evictionDelay: 30s, requeueBase: 5s}
"""
    )
    result = simulate(load(text))
    # The victim's pods hold the node while they terminate; then the preemptor gets it.
    assert use_at(result, 50) == {"h100-0": 8}
    assert outcome(result, "a/urgent")["admittedAt"] == 80
    assert outcome(result, "a/batch")["evictions"] == 1
    assert outcome(result, "a/batch")["finishedAt"] == 180 + 1000
    check_nodes_never_overfull(result)


# -------------------------------------------------------------------- quota-only mode


QUOTA_ONLY = (
    """
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: a}
spec:
  flavors: [{name: default, quota: {nvidia.com/gpu: 8}}]
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: a}
spec: {clusterQueue: a}
"""
    + job("a", "x", gpus=9)
    + job("a", "y", gpus=4, at="1s")
)


def test_a_scenario_without_nodes_admits_on_quota_alone_and_says_so_once(tmp_path: Path) -> None:
    result = simulate(load(QUOTA_ONLY))
    assert result.nodes is None and result.node_events == ()
    data = to_json(result)
    assert data["placement"] == {"mode": "quota-only"}
    assert outcome(result, "a/y")["admittedAt"] == 1  # 4 GPUs on no node at all: quota says yes
    assert outcome(result, "a/x")["placementWait"] == 0
    path = tmp_path / "quota-only.yaml"
    path.write_text(QUOTA_ONLY)
    table = CliRunner().invoke(main, ["simulate", str(path), "--no-history"])
    assert table.exit_code == 0, table.output
    assert table.stdout.count("quota-only mode") == 1
    assert "Waited for nodes" not in table.stdout
    page = render_html(result)
    assert page.count("quota-only mode") == 1 and "per node over time" not in page


# ------------------------------------------------------------------------ the report


def test_the_table_shows_waits_for_nodes_and_the_free_room_on_nodes() -> None:
    args = ["simulate", str(EXAMPLE), "--placement", "Spread", "--no-history"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Waited for nodes" in out and "Avg free on partly used" in out
    assert "quota-only" not in out
    (training,) = [line for line in out.splitlines() if "training" in line]
    assert training.rstrip(" │").endswith("1h03m")  # 3 gangs waited 1h03m in all for nodes


def test_the_html_report_has_tables_and_a_node_heat_map() -> None:
    result = simulate(parse_scenario(list(yaml.safe_load_all(EXAMPLE.read_text()))))
    page = render_html(result)
    assert "<table class='sortable'>" in page and "<pre>" not in page
    assert "gpu in use per node over time" in page
    assert "gpu: fragments on partly used nodes against whole free nodes" in page
    assert "gpu (devices)" in page  # the usage axis says its unit
    assert "amount (devices; cpu in millicores" not in page
    assert len(page) < 400_000  # series are downsampled, the plotting code is small


# ----------------------------------------------------------------------- invariants


@st.composite
def workloads(draw: st.DrawFn) -> str:
    """Random jobs on three 8-GPU nodes in two queues; an elastic one in queue a resizes."""
    strategies = st.sampled_from(["BinPack", "Spread"])
    text = nodes(3) + queue("a", 16, draw(strategies)) + queue("b", 16, draw(strategies))
    text += job("a", "elastic", gpus=draw(st.integers(1, 4)), pods=2, run="250s", elastic=True)
    for i in range(draw(st.integers(1, 12))):
        text += job(
            draw(st.sampled_from(["a", "b"])),
            f"j{i}",
            gpus=draw(st.integers(1, 8)),
            pods=draw(st.integers(1, 4)),
            at=f"{draw(st.integers(0, 100))}s",
            run=f"{draw(st.integers(1, 200))}s",
        )
    for at in draw(st.lists(st.integers(1, 300), max_size=3, unique=True)):
        text += scale("a/elastic", f"{at}s", draw(st.integers(1, 5)))
    return text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_placed_pods_never_exceed_a_node_and_match_the_quota_charged(text: str) -> None:
    result = simulate(load(text))
    check_nodes_never_overfull(result)
    # Every admitted pod is on a node: GPU-seconds on nodes equal GPU-seconds charged to quota.
    on_nodes = 0.0
    used = {n.name: 0 for n in result.nodes or ()}
    since = {n: 0.0 for n in used}
    for event in result.node_events:
        on_nodes += used[event.node] * (event.at - since[event.node])
        used[event.node] = event.used.get(GPU, 0)
        since[event.node] = event.at
    on_nodes += sum(used[n] * (result.end - since[n]) for n in used)
    charged = result.integrals[TOTAL]["usage"].get(("h100", GPU), 0.0)
    assert on_nodes == pytest.approx(charged)
    if result.finished_all:
        assert set(use_at(result, result.end).values()) <= {0}
