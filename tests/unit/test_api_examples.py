"""The examples a user copies from (examples/api/ and docs/api.md) are valid objects, and the
reference documents every field the models have."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from quota.api import KINDS, ClusterQueue, LocalQueue, MusterObject, ResourceFlavor, parse_manifest
from quota.api.conditions import Condition
from quota.api.meta import LabelSelector, Taint, Toleration
from quota.api.queuetree import check_queue_tree

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "api").glob("*.yaml"))
DOCS = (REPO / "docs" / "api.md").read_text()


def _muster_objects(docs: list[dict[str, Any]]) -> list[MusterObject]:
    # Namespaces and other core objects in the examples are kubectl's business, not ours.
    return [parse_manifest(d, i) for i, d in enumerate(docs) if d["apiVersion"] != "v1"]


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/api/ holds no YAML files"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    objects = _muster_objects(list(yaml.safe_load_all(path.read_text())))
    assert objects


def test_examples_cover_every_kind() -> None:
    kinds = {
        type(o).__name__
        for path in EXAMPLES
        for o in _muster_objects(list(yaml.safe_load_all(path.read_text())))
    }
    assert kinds == set(KINDS)


def test_three_team_example_is_a_valid_tree() -> None:
    objects = _muster_objects(
        list(yaml.safe_load_all((REPO / "examples/api/three-team-gpu.yaml").read_text()))
    )
    queues = [o for o in objects if isinstance(o, ClusterQueue)]
    tree = check_queue_tree(
        queues,
        [o for o in objects if isinstance(o, ResourceFlavor)],
        [o for o in objects if isinstance(o, LocalQueue)],
    )
    assert tree.inactive() == frozenset()
    assert all(state.active for state in tree.local_queues.values())
    # The children's guarantees fit in what their parent is guaranteed.
    by_name = {q.name: q for q in queues}
    for parent, children in tree.children.items():
        if not children:
            continue
        for flavor in by_name[parent].spec.flavors:
            for resource, amount in flavor.quota.items():
                given = 0
                for child in children:
                    entry = by_name[child].spec.flavor(flavor.name)
                    given += entry.quota.get(resource, 0) if entry else 0
                assert given <= amount, (parent, flavor.name, resource)


DOC_BLOCKS = [
    yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOCS, flags=re.DOTALL)
]


def test_docs_have_one_valid_example_per_kind() -> None:
    kinds = [parse_manifest(doc, i).kind for i, doc in enumerate(DOC_BLOCKS)]
    assert sorted(kinds) == sorted(KINDS)


# Types documented once in "Shared types" rather than under every field that uses them.
SHARED: dict[type[BaseModel], str] = {
    Condition: "### Condition",
    Toleration: "### Toleration",
    Taint: "### Taint",
    LabelSelector: "### LabelSelector",
}


def _models_in(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The models an annotation holds, and whether inside a list."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    if origin is list:
        return [(m, True) for m, _ in _models_in(typing.get_args(annotation)[0])]
    if origin is dict:
        return []  # maps of quantities or strings
    return [found for arg in typing.get_args(annotation) for found in _models_in(arg)]


def _field_paths(model: type[BaseModel], prefix: str) -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        inner = _models_in(info.annotation)
        listed = any(is_list for _, is_list in inner) or typing.get_origin(info.annotation) is list
        path = f"{prefix}{alias}" + ("[]" if listed else "")
        paths.append(path)
        for sub, _ in inner:
            if sub in SHARED or not sub.model_fields:
                continue
            paths += _field_paths(sub, f"{path}.")
    return paths


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_docs_document_every_field(kind: str) -> None:
    model = KINDS[kind]
    section = DOCS.split(f"\n## {kind}\n", 1)[1].split("\n## ", 1)[0]
    paths = [
        p
        for name in ("spec", "status")
        if name in model.model_fields
        for p in _field_paths(
            typing.cast(type[BaseModel], model.model_fields[name].annotation), f"{name}."
        )
    ]
    missing = [p for p in paths if f"`{p}`" not in section]
    assert not missing, f"docs/api.md does not document {kind} fields: {missing}"


@pytest.mark.parametrize("shared", list(SHARED), ids=lambda m: m.__name__)
def test_docs_document_every_field_of_shared_types(shared: type[BaseModel]) -> None:
    section = DOCS.split(SHARED[shared] + "\n", 1)[1].split("\n### ", 1)[0]
    fields = [info.alias or name for name, info in shared.model_fields.items()]
    missing = [f for f in fields if f"`{f}`" not in section]
    assert not missing, f"docs/api.md does not document {shared.__name__} fields: {missing}"


def test_the_example_workload_fits_its_own_queue() -> None:
    from quota.admission.cycle import admission_cycle
    from quota.manifests.cluster import cluster_state

    docs = list(yaml.safe_load_all((REPO / "examples/api/three-team-gpu.yaml").read_text()))
    # `muster admit` reads queues and Workloads; the PodGroup is the scheduler's business.
    state = cluster_state([d for d in docs if d.get("kind") != "PodGroup"], 0.0)
    result = admission_cycle(state.snapshot)
    assert [a.workload for a in result.admit] == ["team-a/train-llama"], result.pending
