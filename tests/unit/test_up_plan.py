"""`muster up` plays a `muster simulate` scenario on a cluster: what the plan makes of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.up.plan import COMPLETE_DELAY_ANNOTATION, plan_scenario
from quota.api import ManifestError
from tests.conftest import REPO

DEMO = REPO / "examples" / "demo.yaml"


def _docs(path: Path = DEMO) -> list[Any]:
    return list(yaml.safe_load_all(path.read_text()))


def test_the_demo_becomes_an_organisation_nodes_and_timed_actions() -> None:
    plan = plan_scenario(_docs(), "demo")
    kinds = [d["kind"] for d in plan.organisation]
    # Everything a later object refers to comes first.
    assert kinds == sorted(
        kinds,
        key=["Namespace", "PriorityClass", "ResourceFlavor", "ClusterQueue", "LocalQueue"].index,
    )
    assert sorted(n["metadata"]["name"] for n in plan.nodes) == [
        "a100-0",
        "a100-1",
        "cpu-0",
        "h100-0",
        "h100-1",
    ]
    h100 = next(n for n in plan.nodes if n["metadata"]["name"] == "h100-0")
    assert h100["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert h100["metadata"]["labels"]["gpu.example.com/model"] == "h100"
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    times = [a.at for a in plan.actions]
    assert times == sorted(times)
    described = [a.describe() for a in plan.actions]
    assert described[0] == "submitted research/pretrain-1"
    assert "scaled product/serve to 3 pods" in described
    assert described.index("submitted product/serve") < described.index(
        "scaled product/serve to 3 pods"
    )
    # The generator's 8 trials, 20 s apart from 30 s.
    trials = [a for a in plan.actions if a.name.startswith("sweep-trial-")]
    assert [a.at for a in trials] == [30.0 + 20 * i for i in range(8)]


def test_a_job_runs_for_its_run_for_and_asks_the_apiserver_in_its_terms() -> None:
    plan = plan_scenario(_docs(), "demo")
    finetune = next(a for a in plan.actions if a.name == "finetune")
    assert finetune.job is not None
    template = finetune.job["spec"]["template"]
    assert template["metadata"]["annotations"][COMPLETE_DELAY_ANNOTATION] == "180s"
    resources = template["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}
    # An extended resource needs a limit; cpu and memory do not get one made up.
    assert resources["limits"] == {"nvidia.com/gpu": "8"}
    trial = next(a for a in plan.actions if a.name == "sweep-trial-0")
    assert trial.job is not None
    assert trial.job["metadata"]["labels"] == {"muster.dev/queue-name": "gpu"}
    assert trial.job["spec"]["template"]["spec"]["priorityClassName"] == "batch"
    assert (
        trial.job["spec"]["template"]["metadata"]["annotations"][COMPLETE_DELAY_ANNOTATION] == "45s"
    )


def test_namespaces_the_scenario_does_not_declare_are_created() -> None:
    docs = [d for d in _docs() if d.get("kind") != "Namespace"]
    plan = plan_scenario(docs, "demo")
    assert sorted(d["metadata"]["name"] for d in plan.organisation if d["kind"] == "Namespace") == [
        "product",
        "research",
    ]


def test_a_generator_with_a_bare_priority_is_refused_with_its_field() -> None:
    docs = _docs()
    generator = next(d for d in docs if d.get("kind") == "WorkloadGenerator")
    del generator["spec"]["classes"][0]["priorityClassName"]
    generator["spec"]["classes"][0]["priority"] = 5
    with pytest.raises(
        ManifestError, match=r"spec\.classes\[trial\]\.priority: .*priorityClassName"
    ):
        plan_scenario(docs, "demo")


def test_a_scenario_the_simulator_refuses_is_refused_the_same_way() -> None:
    docs = _docs()
    job = next(d for d in docs if d.get("kind") == "Job")
    del job["metadata"]["annotations"]["muster.dev/run-for"]
    with pytest.raises(ManifestError, match="run-for"):
        plan_scenario(docs, "demo")


def test_muster_up_names_the_broken_file_and_starts_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: muster.dev/v1alpha1\nkind: ClusterQueue\n"
        "metadata: {name: a}\nspec: {flavors: 5}\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "controllers.main",
            "up",
            str(broken),
            "--dir",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "broken.yaml" in result.stderr and "spec.flavors" in result.stderr
    assert not (tmp_path / "c").exists()  # nothing was started
