"""`muster import` on malformed input never gets a traceback or a hang (issue 15): the
hand-found classes of bad files, and a few hundred mutations of the example imports from a
fixed seed, each run through the real command line in-process."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_fuzz_inputs import _mutate, _values, assert_clean, assert_refused, run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "imports"
SOURCES = ("kueue", "kai", "volcano")


def _example_docs(source: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((EXAMPLES / source).glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return docs


def test_unreadable_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    cases = {
        "binary.yaml": b"\xff\xfe\x00kind: Queue\n",
        "broken.yaml": b"kind: [Queue\n",
        "deep.yaml": b"a: " + b"[" * 60 + b"]" * 60 + b"\n",
        "empty.yaml": b"",
        "scalar.yaml": b"just text\n",
        "nokind.yaml": b"apiVersion: scheduling.volcano.sh/v1beta1\nmetadata: {name: q}\n",
        "other.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
        "kueue.yaml": b"apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: q}",
    }
    needles = {
        "binary.yaml": "not UTF-8",
        "broken.yaml": "not valid YAML",
        "deep.yaml": "nested",
        "empty.yaml": "no documents",
        "scalar.yaml": "expected a mapping",
        "nokind.yaml": "kind: required field is missing",
        "other.yaml": "no volcano queue objects",
        "kueue.yaml": "not a Volcano object (use `muster import kueue`)",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert_refused(run("import", "volcano", str(path)), name, needles[name])


@pytest.mark.parametrize("source", SOURCES)
def test_mutated_example_imports_never_get_a_traceback(tmp_path: Path, source: str) -> None:
    rng = random.Random(f"import-{source}")
    original = _example_docs(source)
    path = tmp_path / "case.yaml"
    for case in range(120):
        docs, what = _mutate(original, rng)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        # Every third case also runs the simulator on what was imported.
        extra = ("--simulate",) if case % 3 == 0 else ()
        result = run("import", source, str(path), "-o", str(tmp_path / "out"), *extra)
        assert_clean(result, context=f"{source} case {case}: {what}")


def test_simulate_without_pending_work_and_a_bad_run_for_are_refused() -> None:
    queues = str(EXAMPLES / "volcano" / "queues.yaml")
    assert_refused(run("import", "volcano", queues, "--simulate"), "nothing to simulate")
    assert_refused(run("import", "volcano", queues, "--run-for", "soon"), "--run-for")


# Each source's kinds with fields drawn at random: the shapes the importers read, malformed
# at every level.
_source_documents = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(
            [
                "kueue.x-k8s.io/v1beta1",
                "kueue.x-k8s.io/v1beta2",
                "scheduling.run.ai/v2",
                "scheduling.run.ai/v2alpha2",
                "scheduling.volcano.sh/v1beta1",
                "batch.volcano.sh/v1alpha1",
                "batch/v1",
                "v1",
            ]
        ),
        "kind": st.sampled_from(
            [
                *("ClusterQueue", "Cohort", "LocalQueue", "ResourceFlavor", "Queue", "PodGroup"),
                *("Workload", "WorkloadPriorityClass", "Job", "Pod", "Node"),
            ]
        ),
        "metadata": st.one_of(
            _values,
            st.fixed_dictionaries(
                {"name": st.sampled_from(["a", "b", "root", "default", "Bad"])},
                optional={"namespace": _values, "labels": _values, "annotations": _values},
            ),
        ),
        "spec": _values,
        "value": _values,
        "status": _values,
    }
)


@settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from(SOURCES), st.lists(_source_documents, min_size=1, max_size=4))
def test_drawn_documents_never_get_a_traceback(
    tmp_path: Path, source: str, docs: list[dict[str, Any]]
) -> None:
    path = tmp_path / "drawn.yaml"
    path.write_text(yaml.safe_dump_all(docs, allow_unicode=True))
    assert_clean(run("import", source, str(path), "--simulate"), context=(source, docs))
