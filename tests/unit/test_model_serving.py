"""A LeaderWorkerSet document read once for the simulator and the importer
(quota/model/serving.py `leader_worker_set`): its defaults, its edges, and each bad field
refused through the caller's own error, naming the field and the rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from quota.model.serving import LEADER, WORKERS, leader_worker_set, lws_group

WORKER_SPEC = {"containers": [{"name": "w", "resources": {"requests": {"cpu": "1"}}}]}
LEADER_SPEC = {"containers": [{"name": "l", "resources": {"requests": {"cpu": "2"}}}]}


DELETE = object()  # a field value: remove the field


class CallerError(Exception):
    """Stands for the simulator's or the importer's error kind."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


def lws(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llm", "annotations": {}},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4}},
    }
    doc["spec"]["leaderWorkerTemplate"]["workerTemplate"] = {"spec": WORKER_SPEC}
    for path, value in fields.items():
        *parents, leaf = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return doc


def test_a_leaderworkerset_gives_its_replicas_size_and_pod_specs() -> None:
    doc = lws(spec__leaderWorkerTemplate__leaderTemplate={"spec": LEADER_SPEC})
    read = leader_worker_set(doc, CallerError)
    assert (read.replicas, read.size, read.degradable) == (2, 4, False)
    assert read.leader.spec == LEADER_SPEC
    assert read.leader.path == "spec.leaderWorkerTemplate.leaderTemplate.spec"
    assert read.workers.spec == WORKER_SPEC
    assert read.workers.path == "spec.leaderWorkerTemplate.workerTemplate.spec"


def test_unset_replicas_and_size_are_one_and_the_leader_runs_the_worker_template() -> None:
    doc = lws(spec__replicas=DELETE)
    del doc["spec"]["leaderWorkerTemplate"]["size"]
    read = leader_worker_set(doc, CallerError)
    assert (read.replicas, read.size) == (1, 1)
    assert read.leader == read.workers
    # A group of one pod is its leader alone.
    assert [(s.name, s.count) for s in lws_group(read.size, read.degradable)] == [(LEADER, 1)]


def test_size_one_and_zero_replicas_are_accepted() -> None:
    read = leader_worker_set(lws(spec__replicas=0, spec__leaderWorkerTemplate__size=1), CallerError)
    assert (read.replicas, read.size) == (0, 1)


@pytest.mark.parametrize("value", ["single", "Single", "SINGLE"])
def test_the_disruption_mode_annotation_makes_it_degradable_in_any_case(value: str) -> None:
    doc = lws(
        metadata__annotations={"muster.dev/disruption-mode": value},
        spec__leaderWorkerTemplate__restartPolicy="None",
    )
    read = leader_worker_set(doc, CallerError)
    assert read.degradable
    protected = {s.name: s.protected for s in lws_group(read.size, read.degradable)}
    assert protected == {LEADER: 1, WORKERS: 0}


def test_all_and_no_annotations_keep_the_groups_whole() -> None:
    assert not leader_worker_set(
        lws(metadata__annotations={"muster.dev/disruption-mode": "all"}), CallerError
    ).degradable
    assert not leader_worker_set(lws(metadata=DELETE), CallerError).degradable


@pytest.mark.parametrize(
    ("fields", "path", "rule"),
    [
        ({"spec__leaderWorkerTemplate__size": 0}, "spec.leaderWorkerTemplate.size", "0: a group"),
        ({"spec__leaderWorkerTemplate__size": -3}, "spec.leaderWorkerTemplate.size", "-3: a"),
        (
            {"spec__leaderWorkerTemplate__size": "4"},
            "spec.leaderWorkerTemplate.size",
            "must be a whole number (got '4')",
        ),
        (
            {"spec__leaderWorkerTemplate__size": True},
            "spec.leaderWorkerTemplate.size",
            "must be a whole number (got True)",
        ),
        ({"spec__replicas": -1}, "spec.replicas", "-1: replicas must not be negative"),
        ({"spec__replicas": 1.5}, "spec.replicas", "must be a whole number (got 1.5)"),
        (
            {"metadata__annotations": {"muster.dev/disruption-mode": "some"}},
            "metadata.annotations[muster.dev/disruption-mode]",
            'must be "single" or "all" (got \'some\')',
        ),
        ({"metadata__annotations": ["x"]}, "metadata.annotations", "must be a mapping"),
        ({"spec": DELETE}, "spec", "required field is missing"),
        ({"spec__leaderWorkerTemplate": DELETE}, "spec.leaderWorkerTemplate", "required field"),
        (
            {"spec__leaderWorkerTemplate__workerTemplate": DELETE},
            "spec.leaderWorkerTemplate.workerTemplate.spec",
            "required: the pod spec",
        ),
        (
            {"spec__leaderWorkerTemplate__leaderTemplate": {"metadata": {}}},
            "spec.leaderWorkerTemplate.leaderTemplate.spec",
            "required: the pod spec",
        ),
    ],
)
def test_a_bad_field_is_refused_through_the_callers_error(
    fields: dict[str, Any], path: str, rule: str
) -> None:
    doc = lws(**fields)
    before = copy.deepcopy(doc)
    with pytest.raises(CallerError) as error:
        leader_worker_set(doc, CallerError)
    assert error.value.path == path
    assert error.value.rule.startswith(rule), error.value.rule
    assert doc == before  # read only


@pytest.mark.parametrize("policy", [None, "RecreateGroupOnPodRestart"])
def test_a_degradable_set_must_not_restart_its_group_for_one_worker(policy: str | None) -> None:
    doc = lws(metadata__annotations={"muster.dev/disruption-mode": "single"})
    if policy is not None:
        doc["spec"]["leaderWorkerTemplate"]["restartPolicy"] = policy
    with pytest.raises(CallerError) as refused:
        leader_worker_set(doc, CallerError)
    assert refused.value.path == "metadata.annotations[muster.dev/disruption-mode]"
    assert "restartPolicy None" in refused.value.rule
    doc["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Default"  # LWS's older name
    assert leader_worker_set(doc, CallerError).degradable
