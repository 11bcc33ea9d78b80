"""The webhook server in its own process: it answers reviews over verified TLS, takes the
queue objects' warnings from the controller's side, serves a rotated certificate, comes back
when it dies, and exits when the controller's side goes away."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from controllers.webhooks import certs, reviews
from controllers.webhooks.process import WebhookProcess


def bundle_for(ca: certs.KeyPair) -> certs.CertBundle:
    return certs.CertBundle(ca, certs.issue_serving(ca, ["127.0.0.1"]), ca.cert_pem)


def review(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "object": obj},
    }


def post(port: int, ca: bytes, tmp: Path, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    ca_file = tmp / "ca.crt"
    ca_file.write_bytes(ca)
    context = ssl.create_default_context(cafile=str(ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(body))
        answer: dict[str, Any] = json.loads(conn.getresponse().read())
        return answer["response"]
    finally:
        conn.close()


JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "j", "namespace": "team", "labels": {"muster.dev/queue-name": "q"}},
    "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
}
QUEUE = {
    "apiVersion": "muster.dev/v1alpha1",
    "kind": "LocalQueue",
    "metadata": {"name": "q", "namespace": "team"},
    "spec": {"clusterQueue": "missing"},
}


@pytest.fixture
def served() -> Iterator[tuple[WebhookProcess, certs.KeyPair, list[Any]]]:
    asked: list[Any] = []

    def warnings(obj: Mapping[str, Any]) -> list[str]:
        asked.append(obj)
        return [f"the controller's caches say {obj['spec']['clusterQueue']} is missing"]

    ca = certs.new_ca("test-ca")
    process = WebhookProcess("127.0.0.1", 0, scheduler_name="", queue_warnings=warnings)
    process.reload(bundle_for(ca))
    process.start()
    assert process.wait_ready(60), "the webhook process never served"
    try:
        yield process, ca, asked
    finally:
        process.stop()


def test_reviews_are_answered_in_a_child_process_with_the_controllers_warnings(
    served: tuple[WebhookProcess, certs.KeyPair, list[Any]], tmp_path: Path
) -> None:
    process, ca, asked = served
    assert process.pid is not None and process.pid != os.getpid()
    response = post(process.port, ca.cert_pem, tmp_path, reviews.MUTATE_JOB_PATH, review(JOB))
    assert response["allowed"] is True and response["patch"]
    response = post(
        process.port, ca.cert_pem, tmp_path, reviews.VALIDATE_QUEUES_PATH, review(QUEUE)
    )
    assert response["allowed"] is True
    assert response["warnings"] == ["the controller's caches say missing is missing"]
    assert asked and asked[0]["metadata"]["name"] == "q"
    # Latencies come back to the controller for the metrics (sent in batches).
    deadline = time.monotonic() + 5
    while len(process.latencies()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(process.latencies()) == 2 and all(0 < s < 5 for s in process.latencies())


def test_a_rotated_certificate_is_served_and_a_dead_child_is_replaced(
    served: tuple[WebhookProcess, certs.KeyPair, list[Any]], tmp_path: Path
) -> None:
    process, _, _ = served
    other_ca = certs.new_ca("rotated-ca")
    process.reload(bundle_for(other_ca))
    deadline = time.monotonic() + 5
    while True:
        try:
            response = post(
                process.port, other_ca.cert_pem, tmp_path, reviews.MUTATE_JOB_PATH, review(JOB)
            )
            break
        except ssl.SSLError:
            assert time.monotonic() < deadline, "the rotated certificate was never served"
            time.sleep(0.05)
    assert response["allowed"] is True

    first = process.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            if process.pid != first:
                response = post(
                    process.port,
                    other_ca.cert_pem,
                    tmp_path,
                    reviews.MUTATE_JOB_PATH,
                    review(JOB),
                )
                break
        except (OSError, ssl.SSLError):
            pass
        assert time.monotonic() < deadline, "no new webhook process answered"
        time.sleep(0.1)
    assert response["allowed"] is True and process.restarts == 1


def test_the_child_exits_with_the_controllers_side() -> None:
    ca = certs.new_ca("test-ca")
    process = WebhookProcess("127.0.0.1", 0, scheduler_name="")
    process.reload(bundle_for(ca))
    process.start()
    assert process.wait_ready(60)
    pid = process.pid
    assert pid is not None
    process.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
