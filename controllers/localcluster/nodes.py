"""Fake nodes of any shape, run by kwok: how tests and users build a cluster to schedule on."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import yaml

from controllers.localcluster.kubectl import kubectl

GPU_RESOURCE = "nvidia.com/gpu"


def node_manifest(
    name: str,
    cpu: str,
    memory: str,
    gpu: int,
    pods: int,
    labels: Mapping[str, str],
    taints: list[dict[str, str]] | None = None,
) -> dict[str, object]:
    capacity: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpu:
        capacity[GPU_RESOURCE] = str(gpu)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            # kwok manages only nodes carrying this annotation.
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints or []},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def create_nodes(
    kubectl_bin: str,
    kubeconfig: Path | str,
    count: int,
    *,
    prefix: str = "node",
    cpu: str = "32",
    memory: str = "256Gi",
    gpu: int = 0,
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    wait_ready: float = 60.0,
) -> list[str]:
    """Create `count` nodes named `<prefix>-<n>` after any existing ones and wait for Ready."""
    existing = json.loads(kubectl(kubectl_bin, kubeconfig, "get", "nodes", "-o", "json").stdout)[
        "items"
    ]
    taken = {item["metadata"]["name"] for item in existing}
    names: list[str] = []
    index = 0
    while len(names) < count:
        candidate = f"{prefix}-{index}"
        if candidate not in taken:
            names.append(candidate)
        index += 1
    docs = [node_manifest(n, cpu, memory, gpu, pods, labels or {}, taints) for n in names]
    kubectl(
        kubectl_bin,
        kubeconfig,
        "create",
        "-f",
        "-",
        input=yaml.safe_dump_all(docs, sort_keys=False),
    )
    if wait_ready > 0:
        wait_nodes_ready(kubectl_bin, kubeconfig, names, wait_ready)
    return names


def wait_nodes_ready(
    kubectl_bin: str, kubeconfig: Path | str, names: list[str], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        items = json.loads(kubectl(kubectl_bin, kubeconfig, "get", "nodes", "-o", "json").stdout)[
            "items"
        ]
        for item in items:
            conditions = item.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                pending.discard(item["metadata"]["name"])
        if pending:
            time.sleep(0.5)
    if pending:
        raise TimeoutError(
            f"nodes not Ready after {timeout:.0f}s: {', '.join(sorted(pending))} "
            "(is kwok running? see its log in the cluster directory)"
        )
