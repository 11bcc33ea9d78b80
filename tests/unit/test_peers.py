"""Peer controllers: which are started for a name list, and how their own webhook
configurations are pointed at a manager running out of cluster."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from controllers.localcluster import peers


def test_names_bring_what_they_require_first_and_once() -> None:
    assert [p.name for p in peers.parse_names("trainer")] == ["jobset", "trainer"]
    assert [p.name for p in peers.parse_names("jobset, trainer,jobset")] == ["jobset", "trainer"]
    assert peers.parse_names("") == []
    assert [p.name for p in peers.parse_names("lws,kuberay")] == ["lws", "kuberay"]


def test_an_unknown_peer_is_named_with_the_known_ones() -> None:
    with pytest.raises(peers.PeerError, match=r"unknown peer 'volcano' \(known: jobset, "):
        peers.parse_names("jobset,volcano")


def test_kueue_is_built_but_never_started_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kueue = peers.PEERS["kueue"]
    # Its one dependency the checksum database does not know is exempted by name, alone.
    assert kueue.nosumdb == "sigs.k8s.io/scheduler-library"
    monkeypatch.setenv("MUSTER_CACHE_DIR", str(tmp_path))
    assert kueue.directory == tmp_path / "kueue-v0.19.2"
    with pytest.raises(peers.PeerError, match="benchmarks only"):
        peers.start(None, kueue)  # type: ignore[arg-type]


def test_webhooks_point_at_the_local_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUSTER_CACHE_DIR", str(tmp_path))
    jobset = peers.PEERS["jobset"]
    manifest = jobset.manifest_dir / "webhook" / "manifests.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "MutatingWebhookConfiguration",
                    "metadata": {"name": "mutating-webhook-configuration"},
                    "webhooks": [
                        {
                            "name": "mjobset.kb.io",
                            "clientConfig": {
                                "service": {
                                    "name": "webhook-service",
                                    "namespace": "system",
                                    "path": "/mutate-jobset",
                                }
                            },
                            "failurePolicy": "Fail",
                        }
                    ],
                }
            ]
        )
    )
    [config] = peers.webhook_configurations(jobset, "https://127.0.0.1:9", b"CA")
    assert config["metadata"] == {"name": "muster-peer-jobset-mutating-webhook-configuration"}
    [hook] = config["webhooks"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9/mutate-jobset",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hook["failurePolicy"] == "Fail"  # run as in a cluster, not loosened


def test_a_peer_not_built_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUSTER_CACHE_DIR", str(tmp_path))
    with pytest.raises(peers.PeerError, match="muster local-cluster build --peers jobset"):
        peers.start(None, peers.PEERS["jobset"])  # type: ignore[arg-type]


def test_json_patches_of_a_kustomization_are_applied_as_kustomize_would() -> None:
    doc = {"metadata": {"name": "a"}, "webhooks": [{"name": "x"}, {"name": "y"}]}
    peers.json_patch(
        doc,
        [
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "replace", "path": "/webhooks/1", "value": {"name": "z"}},
            {"op": "add", "path": "/webhooks/-", "value": {"name": "w"}},
            {"op": "add", "path": "/metadata/labels", "value": {"k": "v"}},
            {"op": "remove", "path": "/webhooks/0"},
        ],
    )
    assert doc == {
        "metadata": {"name": "b", "labels": {"k": "v"}},
        "webhooks": [{"name": "z"}, {"name": "w"}],
    }
    with pytest.raises(peers.PeerError, match="unsupported JSON patch operation 'move'"):
        peers.json_patch(doc, [{"op": "move", "path": "/metadata/name", "from": "/x"}])


def test_a_directory_with_a_kustomization_yields_only_what_it_lists(tmp_path: Path) -> None:
    runtimes = tmp_path / "runtimes"
    (runtimes / "extra").mkdir(parents=True)
    (runtimes / "kustomization.yaml").write_text("resources: [a.yaml, extra]\n")
    (runtimes / "a.yaml").write_text("kind: A\n")
    (runtimes / "unlisted.yaml").write_text("kind: U\n")
    (runtimes / "extra" / "b.yaml").write_text("kind: B\n")
    files = peers._yaml_files(tmp_path, ["runtimes"])
    assert [f.name for f in files] == ["a.yaml", "b.yaml"]
    with pytest.raises(peers.PeerError, match="missing from the peer's manifests"):
        peers._yaml_files(tmp_path, ["nope"])
