"""crds/ is generated from the models and must match them; the generated schemas are
structural (what the apiserver requires) and carry the rules and columns users rely on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from controllers.cli.crds import crds, custom_resource_definition, generated_files, stale_files
from quota.api import KINDS

REPO = Path(__file__).resolve().parents[2]


def test_crds_directory_matches_the_models() -> None:
    stale = stale_files(REPO / "crds")
    assert not stale, f"crds/ is stale ({', '.join(stale)}); run `muster crds`"


def test_check_flag_detects_a_stale_file(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(crds, ["--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(crds, ["--out", str(tmp_path), "--check"]).exit_code == 0
    target = tmp_path / "muster.dev_clusterqueues.yaml"
    target.write_text(target.read_text().replace("maxItems: 16", "maxItems: 17", 1))
    result = runner.invoke(crds, ["--out", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "muster.dev_clusterqueues.yaml" in result.output
    # Regenerating fixes it and removes files for kinds that no longer exist.
    (tmp_path / "muster.dev_cohorts.yaml").write_text("old")
    assert runner.invoke(crds, ["--out", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "muster.dev_cohorts.yaml").exists()
    assert stale_files(tmp_path) == []


def test_generated_files_are_valid_yaml_of_every_kind() -> None:
    files = generated_files()
    kinds = {yaml.safe_load(text)["spec"]["names"]["kind"] for text in files.values()}
    assert kinds == set(KINDS)


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}[*]")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_schemas_are_structural(kind: str) -> None:
    crd = custom_resource_definition(KINDS[kind])
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        where = f"{kind}{path}"
        for forbidden in ("$ref", "$defs", "title", "const", "examples"):
            assert forbidden not in node, f"{where} has {forbidden}"
        assert "anyOf" not in node, f"{where} kept an anyOf"
        assert node.get("additionalProperties") not in (True, False), where
        assert not ("properties" in node and "additionalProperties" in node), where
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed or node.get("x-kubernetes-preserve-unknown-fields"), f"{where} has no type"
        if node.get("type") == "integer":
            assert node["format"] in ("int32", "int64"), where


def _rules(kind: str) -> dict[str, list[str]]:
    crd = custom_resource_definition(KINDS[kind])
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return {
        path: [v["message"] for v in node["x-kubernetes-validations"]]
        for path, node in _nodes(schema)
        if "x-kubernetes-validations" in node
    }


def test_cross_field_rules_sit_where_their_fields_are_visible() -> None:
    cq = _rules("ClusterQueue")
    # metadata.name is only visible to CEL at the root of the schema.
    assert cq[""] == ["a ClusterQueue cannot be its own parent"]
    assert cq[".spec.flavors[]"] == ["quota must not exceed limit"]
    assert "must not be negative" in cq[".spec.flavors[].quota[*]"]
    assert "must not be negative" in cq[".status.usage[*][*]"]
    wl = _rules("Workload")
    assert wl[".spec.podSets[]"] == [
        "minCount must not exceed count",
        "topologyRequest.sliceSize must divide count",
        "protectedCount must not exceed count",
    ]
    assert wl[".spec.podSets[].topologyRequest"] == [
        "at most one of required, preferred, requiredTier, preferredTier and unconstrained",
        "sliceSize and sliceRequiredTopology go together",
    ]
    topology = _rules("Topology")
    assert topology[".spec"] == [
        "levels must be unique",
        "kubernetes.io/hostname may only be the last level",
    ]
    assert wl[".spec"] == ["replaces requires sliceName"]
    pg = _rules("PodGroup")
    assert pg[".spec.schedulingPolicy"] == ["exactly one of basic or gang must be set"]
    assert pg[".spec.disruptionMode"] == ["exactly one of single or all must be set"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_cel_rule_is_bounded(kind: str) -> None:
    """The apiserver refuses CEL whose cost it cannot bound: every list and map that a rule
    can reach, and every string-valued quantity, must carry a maximum size."""
    crd = custom_resource_definition(KINDS[kind])
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema):
        if "x-kubernetes-validations" not in node:
            continue
        for sub_path, sub in _nodes(node, path):
            if sub.get("type") == "array":
                assert "maxItems" in sub, f"{kind}{sub_path} has a rule but no maxItems"
            if isinstance(sub.get("additionalProperties"), dict):
                assert "maxProperties" in sub, f"{kind}{sub_path} has no maxProperties"
            if sub.get("x-kubernetes-int-or-string"):
                assert "maxLength" in sub, f"{kind}{sub_path} has no maxLength"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_printer_columns_point_at_fields_that_exist(kind: str) -> None:
    crd = custom_resource_definition(KINDS[kind])
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if path == ".metadata.creationTimestamp":
            continue
        node = schema
        for part in re.sub(r"\[\?\(.*?\)\]", "[]", path).strip(".").split("."):
            name, _, rest = part.partition("[")
            assert name in node.get("properties", {}), f"{kind} column {column['name']}: {path}"
            node = node["properties"][name]
            if rest:
                node = node["items"]
        # kubectl prints maps and lists in a string column as JSON.
        expected = {"integer": ["integer"], "string": ["string", "object", "array"]}
        assert node.get("type") in expected[column["type"]], f"{kind} {column['name']} type"


def test_cluster_queue_has_the_columns_and_names_kubectl_users_need() -> None:
    crd = custom_resource_definition(KINDS["ClusterQueue"])
    spec = crd["spec"]
    assert spec["names"]["shortNames"] == ["cq"]
    assert spec["names"]["categories"] == ["muster"]
    assert spec["scope"] == "Cluster"
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Parent",
        "Priority",
        "Weight",
        "Pending",
        "Admitted",
        "Active",
        "Usage",
        "Age",
    ]


def test_descriptions_come_from_the_models() -> None:
    crd = custom_resource_definition(KINDS["ClusterQueue"])
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for name, field in spec["properties"].items():
        assert field.get("description"), f"ClusterQueue spec.{name} has no description"
    assert spec["properties"]["overQuotaWeight"]["default"] == 1
    assert spec["properties"]["preemption"]["default"] == {}
    assert spec["properties"]["queueingStrategy"]["enum"] == ["StrictFIFO", "BestEffortFIFO"]
