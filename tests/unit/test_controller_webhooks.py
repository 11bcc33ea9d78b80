"""Admission webhooks and their certificates, without a cluster: the decisions, the TLS
server answering real HTTPS requests, and certificate rotation kept in a Secret."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from controllers.runtime.resources import SECRET
from controllers.state.caches import Caches
from controllers.webhooks import certs, configurations, decisions, https, policies, reviews
from controllers.webhooks.process import WebhookProcess
from controllers.webhooks.serving import WebhookServing, WebhookSettings
from tests.unit.controller_fakes import FakeKube


def labelled_job(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "labels": {"muster.dev/queue-name": "team"},
            "annotations": annotations,
        },
        "spec": {"parallelism": 4, "template": {"spec": {"containers": [{"name": "m"}]}}},
    }


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Enough of RFC 6902 (add) to check the webhook's patches."""
    for op in ops:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = doc
        for part in parts[:-1]:
            target = target[part]
        if parts[-1] == "-":
            target.append(op["value"])
        else:
            target[parts[-1]] = op["value"]
    return doc


def test_mutation_suspends_labelled_jobs_and_gates_elastic_ones() -> None:
    plain = apply_json_patch(labelled_job(), decisions.mutate_job(labelled_job()))
    assert plain["spec"]["suspend"] is True
    assert "schedulingGates" not in plain["spec"]["template"]["spec"]

    elastic = labelled_job(**{"muster.dev/elastic-job": "true"})
    patched = apply_json_patch(elastic, decisions.mutate_job(elastic))
    assert patched["spec"]["template"]["spec"]["schedulingGates"] == [
        {"name": "muster.dev/admission"}
    ]
    assert patched["spec"]["template"]["metadata"]["labels"] == {"muster.dev/elastic-job": "true"}

    unlabelled = labelled_job()
    del unlabelled["metadata"]["labels"]
    assert decisions.mutate_job(unlabelled) == []


def test_validation_refuses_elastic_with_partial_admission_and_bad_min_parallelism() -> None:
    both = labelled_job(**{"muster.dev/elastic-job": "true", "muster.dev/min-parallelism": "2"})
    refusal = decisions.validate_job(both, None)
    assert refusal is not None and "cannot be combined" in refusal
    assert "min-parallelism must be a whole number between 1 and spec.parallelism (4)" in (
        decisions.validate_job(labelled_job(**{"muster.dev/min-parallelism": "9"}), None) or ""
    )
    assert decisions.validate_job(labelled_job(**{"muster.dev/min-parallelism": "2"}), None) is None


def test_queue_name_cannot_change_while_the_job_runs() -> None:
    old = labelled_job()
    old["spec"]["suspend"] = False
    new = labelled_job()
    new["metadata"]["labels"]["muster.dev/queue-name"] = "other"
    assert "cannot change while the Job runs" in (decisions.validate_job(new, old) or "")
    old["spec"]["suspend"] = True
    assert decisions.validate_job(new, old) is None


def test_a_running_plain_job_cannot_grow_and_the_refusal_points_to_the_elastic_annotation() -> None:
    old = labelled_job()
    old["spec"]["suspend"] = False
    grown = labelled_job()
    grown["spec"]["suspend"] = False
    grown["spec"]["parallelism"] = 40
    refusal = decisions.validate_job(grown, old) or ""
    assert "(4 -> 40 pods)" in refusal and "muster.dev/elastic-job" in refusal
    shrunk = labelled_job()
    shrunk["spec"]["parallelism"] = 2
    assert decisions.validate_job(shrunk, old) is None
    old["spec"]["suspend"] = True  # suspended: it is queued again at the size it asks for
    assert decisions.validate_job(grown, old) is None
    elastic_old = labelled_job(**{"muster.dev/elastic-job": "true"})
    elastic_old["spec"]["suspend"] = False
    elastic_new = labelled_job(**{"muster.dev/elastic-job": "true"})
    elastic_new["spec"]["parallelism"] = 40
    assert decisions.validate_job(elastic_new, elastic_old) is None


def test_the_elastic_annotation_cannot_be_added_or_removed_even_while_suspended() -> None:
    elastic = labelled_job(**{"muster.dev/elastic-job": "true"})
    elastic["spec"]["suspend"] = True
    plain = labelled_job()
    plain["spec"]["suspend"] = True
    assert "cannot be added or removed" in (decisions.validate_job(plain, elastic) or "")
    assert "cannot be added or removed" in (decisions.validate_job(elastic, plain) or "")


def test_queue_objects_get_the_model_checks_cel_cannot_do() -> None:
    bad = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "ClusterQueue",
        "metadata": {"name": "team"},
        "spec": {"flavors": [{"name": "h100", "quota": {"cpu": "0.0001"}}]},
    }
    refusal, _ = decisions.validate_queue_object(bad)
    assert refusal is not None and "millicore" in refusal


@pytest.fixture
def bundle() -> certs.CertBundle:
    ca = certs.new_ca("test-ca")
    return certs.CertBundle(ca, certs.issue_serving(ca, ["127.0.0.1"]), ca.cert_pem)


def test_the_server_answers_admission_reviews_over_verified_tls(
    bundle: certs.CertBundle,
) -> None:
    server = https.WebhookServer("127.0.0.1", 0, reviews.WebhookHandlers())
    server.reload(bundle)
    server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ca_file = Path(tmp) / "ca.crt"
            ca_file.write_bytes(bundle.ca_bundle)
            context = ssl.create_default_context(cafile=str(ca_file))
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context)
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "abc", "operation": "CREATE", "object": labelled_job()},
            }
            for _ in range(2):  # a kept-alive connection serves several reviews
                conn.request(
                    "POST",
                    reviews.MUTATE_JOB_PATH,
                    body=json.dumps(review),
                    headers={"Content-Type": "application/json"},
                )
                answer = json.loads(conn.getresponse().read())
                response = answer["response"]
                assert response["uid"] == "abc" and response["allowed"] is True
                ops = json.loads(base64.b64decode(response["patch"]))
                assert {"op": "add", "path": "/spec/suspend", "value": True} in ops
            conn.close()
    finally:
        server.stop()


def test_certificates_rotate_before_expiry_and_keep_the_old_ca_trusted() -> None:
    kube = FakeKube()
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    manager = certs.CertManager(
        kube,
        "muster-system",
        "tls",
        ["127.0.0.1"],
        ca_lifetime=dt.timedelta(days=90),
        serving_lifetime=dt.timedelta(days=9),
        clock=lambda: now[0],
    )
    changes: list[certs.CertBundle] = []
    manager.on_change(changes.append)
    first = manager.ensure()
    assert certs.covers(first.serving.cert, ["127.0.0.1"])
    assert manager.ensure() == first, "nothing due: nothing rewritten"
    assert len(changes) == 1

    # A second replica reads the same Secret and serves the same certificate.
    other = certs.CertManager(
        kube,
        "muster-system",
        "tls",
        ["127.0.0.1"],
        clock=lambda: now[0],
    )
    assert other.ensure().serving == first.serving

    # Past two thirds of the serving lifetime: a new serving cert, same CA.
    now[0] += dt.timedelta(days=7)
    second = manager.ensure()
    assert second.serving != first.serving and second.ca == first.ca

    # Past two thirds of the CA's lifetime: new CA, and the old one stays in the bundle.
    now[0] += dt.timedelta(days=55)
    third = manager.ensure()
    assert third.ca != first.ca
    assert first.ca.cert_pem in third.ca_bundle and third.ca.cert_pem in third.ca_bundle
    assert certs.signed_by(third.serving.cert, third.ca.cert)
    secret = kube.get(SECRET, "muster-system", "tls")
    assert secret is not None and base64.b64decode(secret["data"]["ca.crt"]) == third.ca.cert_pem


def test_configurations_scope_job_webhooks_to_labelled_jobs(bundle: certs.CertBundle) -> None:
    mutating, validating = configurations.configurations(
        bundle.ca_bundle, url_base="https://h:1", policies=False
    )
    assert mutating is not None
    mjob = next(w for w in mutating["webhooks"] if w["name"] == "mjob.muster.dev")
    assert mjob["objectSelector"]["matchExpressions"] == [
        {"key": "muster.dev/queue-name", "operator": "Exists"}
    ]
    assert mjob["failurePolicy"] == "Fail" and mjob["timeoutSeconds"] == 5
    assert mjob["clientConfig"]["url"] == "https://h:1/mutate-batch-v1-job"
    queues = next(w for w in validating["webhooks"] if w["name"] == "vqueues.muster.dev")
    assert queues["failurePolicy"] == "Ignore"
    service_config, _ = configurations.configurations(
        bundle.ca_bundle, service=("muster-system", "muster-webhooks", 443), policies=False
    )
    assert service_config is not None
    assert service_config["webhooks"][0]["clientConfig"]["service"]["name"] == "muster-webhooks"


def test_with_admission_policies_only_the_queue_objects_webhook_is_called(
    bundle: certs.CertBundle,
) -> None:
    mutating, validating = configurations.configurations(bundle.ca_bundle, url_base="https://h:1")
    assert mutating is None
    assert [w["name"] for w in validating["webhooks"]] == ["vqueues.muster.dev"]
    docs = policies.policies("muster-scheduler")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("MutatingAdmissionPolicy", "muster-jobs"),
        ("MutatingAdmissionPolicyBinding", "muster-jobs"),
        ("MutatingAdmissionPolicy", "muster-suspend"),
        ("MutatingAdmissionPolicyBinding", "muster-suspend"),
        ("MutatingAdmissionPolicy", "muster-pods"),
        ("MutatingAdmissionPolicyBinding", "muster-pods"),
        ("MutatingAdmissionPolicy", "muster-owners-deployments"),
        ("MutatingAdmissionPolicyBinding", "muster-owners-deployments"),
        ("MutatingAdmissionPolicy", "muster-owners-statefulsets"),
        ("MutatingAdmissionPolicyBinding", "muster-owners-statefulsets"),
        ("MutatingAdmissionPolicy", "muster-owners-leaderworkersets"),
        ("MutatingAdmissionPolicyBinding", "muster-owners-leaderworkersets"),
        ("MutatingAdmissionPolicy", "muster-queued-pods"),
        ("MutatingAdmissionPolicyBinding", "muster-queued-pods"),
        ("ValidatingAdmissionPolicy", "muster-jobs"),
        ("ValidatingAdmissionPolicyBinding", "muster-jobs"),
        ("MutatingAdmissionPolicy", "muster-probe"),
        ("MutatingAdmissionPolicyBinding", "muster-probe"),
        ("ValidatingAdmissionPolicy", "muster-probe"),
        ("ValidatingAdmissionPolicyBinding", "muster-probe"),
    ]
    for doc in docs:
        if doc["kind"].endswith("Binding"):
            assert doc["spec"]["policyName"] == doc["metadata"]["name"]
            continue
        # Scoped like the webhooks they replace: labelled objects (or, for pods, those of
        # an admitted JobSet or TrainJob), never kube-system, and refused on a CEL error.
        constraints = doc["spec"]["matchConstraints"]
        assert constraints["namespaceSelector"] == policies.NOT_SYSTEM
        assert constraints["objectSelector"]["matchExpressions"][0]["key"] in (
            "muster.dev/queue-name",
            "muster.dev/owner-uid",
            "muster.dev/admission-probe",
        )
        assert doc["spec"]["failurePolicy"] == "Fail"
    # The scheduler's name is written in one place per policy (the chart templates it).
    text = json.dumps(policies.policies("sched-x"))
    assert text.count("'sched-x'") == 4


def test_creation_is_validated_by_the_mutating_webhook_in_the_same_call() -> None:
    handlers = reviews.WebhookHandlers()
    both = labelled_job(**{"muster.dev/elastic-job": "true", "muster.dev/min-parallelism": "2"})
    review = {"request": {"uid": "u", "operation": "CREATE", "object": both}}
    response = handlers.handle(reviews.MUTATE_JOB_PATH, review)["response"]
    assert response["allowed"] is False
    assert "cannot be combined" in response["status"]["message"]
    assert "patch" not in response


def test_certificates_kept_by_cert_manager_are_read_and_never_written() -> None:
    kube = FakeKube()
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    external = certs.CertManager(
        kube, "muster-system", "tls", ["muster-webhook.muster-system.svc"], managed=False
    )
    with pytest.raises(RuntimeError, match="muster-system/tls does not exist"):
        external.ensure()
    # As cert-manager writes it: tls.crt, tls.key and ca.crt, no CA key.
    ca = certs.new_ca("test-ca", dt.timedelta(days=90), now)
    serving = certs.issue_serving(
        ca, ["muster-webhook.muster-system.svc"], dt.timedelta(days=30), now
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tls", "namespace": "muster-system"},
        "data": {
            "tls.crt": base64.b64encode(serving.cert_pem).decode(),
            "tls.key": base64.b64encode(serving.key_pem).decode(),
            "ca.crt": base64.b64encode(ca.cert_pem).decode(),
        },
    }
    kube.put(SECRET, secret)
    bundle = external.ensure()
    assert bundle.serving.cert_pem == serving.cert_pem
    assert bundle.ca_bundle == ca.cert_pem  # what the webhook configurations trust
    assert not kube.writes
    # Incomplete data: a clear error naming the keys, still no write.
    kube.put(SECRET, {**secret, "data": {"tls.crt": secret["data"]["tls.crt"]}})
    with pytest.raises(RuntimeError, match=r"tls\.crt, tls\.key and ca\.crt"):
        external.ensure()
    assert not kube.writes


@pytest.mark.parametrize("mode", ["policies", "webhooks"])
def test_where_admission_policies_do_the_work_the_queue_webhook_is_served_in_process(
    mode: str,
) -> None:
    """With policies, only queue objects are reviewed: no second interpreter for them. The
    webhooks of every labelled Job keep their process (a busy controller must not delay
    them)."""
    kube = FakeKube()
    caches = Caches.create(kube)
    options = WebhookSettings(
        namespace="muster-system",
        port=0,
        host="127.0.0.1",
        bind=None,
        service=None,
        service_port=443,
        cert_secret="muster-webhook-certs",
        job_admission=mode,
    )
    serving = WebhookServing(kube, options, caches, is_leader=lambda: False)
    stop = threading.Event()
    serving.start(lambda name, run: None, stop)
    server = serving.server
    try:
        if mode == "webhooks":
            assert isinstance(server, WebhookProcess)
            return
        assert isinstance(server, https.WebhookServer) and server.wait_ready(0)
        assert serving.certs is not None and serving.certs.current is not None
        with tempfile.TemporaryDirectory() as tmp:
            ca_file = Path(tmp) / "ca.crt"
            ca_file.write_bytes(serving.certs.current.ca_bundle)
            context = ssl.create_default_context(cafile=str(ca_file))
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context)
            local_queue = {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": "ns"},
                "spec": {"clusterQueue": "missing"},
            }
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "q1", "operation": "CREATE", "object": local_queue},
            }
            conn.request("POST", reviews.VALIDATE_QUEUES_PATH, body=json.dumps(review))
            response = json.loads(conn.getresponse().read())["response"]
            conn.close()
        # Answered from this process's caches: the ClusterQueue it names is not in them.
        assert response["allowed"] is True
        assert response["warnings"] == ["ClusterQueue 'missing' does not exist yet"]
        assert [round(s, 3) >= 0 for s in server.latencies()] == [True]
    finally:
        stop.set()
        serving.stop(registered=False)
