"""An import as a simulation scenario: the imported queues and nodes, and the source's
pending work submitted at its `muster.dev/submit-at` (default: at once) to run for its
`muster.dev/run-for` (default: the command's --run-for)."""

from __future__ import annotations

from dataclasses import replace

from quota.api import parse_manifest
from quota.api.workload import Workload
from quota.importers.report import ImportResult
from quota.model import convert
from quota.simulation.scenario import JobSpec, Scenario, parse_scenario


def to_scenario(result: ImportResult, run_for: float, name: str = "import") -> Scenario:
    """The scenario `muster import --simulate` runs. Raises ManifestError if the imported
    manifests are not a valid scenario (a flavor no node provides, for instance)."""
    scenario = parse_scenario(list(result.manifests), name=name)
    jobs: list[JobSpec] = []
    for index, work in enumerate(result.workloads):
        model = parse_manifest(work.manifest, index)
        assert isinstance(model, Workload)
        namespace = model.metadata.namespace or "default"
        jobs.append(
            JobSpec(
                key=f"{namespace}/{model.name}",
                local_queue=model.spec.queue_name,
                cluster_queue=scenario.local_queues[(namespace, model.spec.queue_name)],
                priority=model.spec.priority or 0,
                submit_at=work.submit_at,
                run_for=work.run_for if work.run_for is not None else run_for,
                pod_sets=convert.pod_sets(model),
            )
        )
    return replace(scenario, jobs=tuple(jobs))
